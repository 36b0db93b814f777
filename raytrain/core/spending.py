"""The service's spending limits, applied to a job's goal before the policy chooses: the
hourly ceiling on everything the service holds or requests at once
(ServiceConfig.max_usd_per_hour), and the budget of a job that sets none of its own
(ServiceConfig.max_usd_per_job). A job the ceiling leaves no room for waits, and its
decision says so.

    goal, note = within_service_limits(goal, ceiling=100.0, others_usd_per_hour=60.0,
                                       job_budget_usd=None, spent_usd=0.0)
    # goal.max_usd_per_hour <= 40; note explains the ceiling when it binds
"""

from __future__ import annotations

from dataclasses import replace

from raytrain.core.autoscale import Goal


def within_service_limits(goal: Goal, ceiling: float | None, others_usd_per_hour: float,
                          job_budget_usd: float | None, spent_usd: float) -> tuple[Goal, str]:
    note = ""
    if ceiling is not None:
        room = max(0.0, ceiling - others_usd_per_hour)
        if goal.max_usd_per_hour is None or room < goal.max_usd_per_hour:
            goal = replace(goal, max_usd_per_hour=room)
            note = (f"the service's ceiling of ${ceiling:,.2f}/h (max_usd_per_hour) leaves "
                    f"${room:,.2f}/h beside the ${others_usd_per_hour:,.2f}/h other jobs hold; "
                    "it waits until they end or the operator raises the ceiling")
    if goal.budget_usd is None and job_budget_usd is not None:
        goal = replace(goal, budget_usd=max(0.0, job_budget_usd - spent_usd))
    return goal, note
