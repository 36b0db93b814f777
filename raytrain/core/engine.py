"""One job's capacity engine: the policy (raytrain.core.autoscale) with what it has to
remember between decisions, fed events and answering decisions. The live service's
provisioner builds one for each decision from the job's record, and the simulator replays
traces through that same live service (raytrain.sim.replay), so a policy measured on a
trace is the policy a job gets.

Events (`EngineEvent`): the job is submitted, its capacity is preempted, the capacity it
asked for did not come in time, time passed (a review) or prices changed. Each returns a
`Decision`: start, stay, switch (now, or at a checkpoint) or wait, with the checkpoint
interval of the capacity chosen. Capacity found missing is marked with the time it was
found so, and tried again `PolicySpec.capacity_retry_s` later: a market empty an hour ago is
not empty for good. Pure: values in, values out; the time is an argument.

    engine = CapacityEngine(policy, offers, throughput)
    decision = engine.on(EngineEvent.SUBMIT, goal, now=0.0)
    decision = engine.on(EngineEvent.PREEMPTION, goal, now=600.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from raytrain.core.autoscale import (
    Decision,
    Goal,
    Observed,
    Option,
    Throughput,
    choose,
    options,
    redecide,
    time_in_hand_s,
)
from raytrain.core.costs import Costs, policy_costs
from raytrain.spec import Offer, PolicySpec


class EngineEvent(str, Enum):
    SUBMIT = "submit"
    PREEMPTION = "preemption"
    CAPACITY_MISSING = "capacity-missing"
    PROGRESS = "progress"
    PRICES = "prices"


Missing = Mapping[tuple[str, str], float]  # (offer id, market) -> when found missing


@dataclass
class CapacityEngine:
    policy: PolicySpec
    offers: list[Offer]
    throughput: Throughput
    # Per offer: (preemptions, spot node-hours), this job's and the service's others'.
    history: dict[str, tuple[int, float]] = field(default_factory=dict)
    current: Option | None = None  # the capacity last decided on
    missing: Missing = field(default_factory=dict)
    preemptions: int = 0  # of this job
    costs: Costs | None = None  # None: the policy's assumptions

    def observed(self, now: float) -> Observed:
        retry = self.policy.capacity_retry_s
        return Observed(spot_history=dict(self.history), preemptions=self.preemptions,
                        unavailable=frozenset(key for key, since in self.missing.items()
                                              if now - since < retry))

    def on(self, event: EngineEvent, goal: Goal, now: float) -> Decision:
        """Decide on `event` for what is left of the job (`goal`) at time `now`."""
        event = EngineEvent(event)
        costs = self.costs or policy_costs(self.policy)
        if event == EngineEvent.CAPACITY_MISSING and self.current is not None:
            if self._time_in_hand(goal, now, costs):
                return Decision("stay", self.current, "capacity missing, time in hand: waiting")
            self.missing = {**self.missing, (self.current.offer.id, self.current.market): now}
        observed = self.observed(now)
        if self.current is None or event == EngineEvent.SUBMIT:
            decision = choose(goal, self.offers, self.throughput, self.policy, observed, costs)
        else:
            decision = redecide(self.current, event.value, goal, self.offers, self.throughput,
                                self.policy, observed, costs)
        if decision.option is not None and decision.action in ("start", "stay", "switch"):
            self.current = decision.option
        return decision

    def _time_in_hand(self, goal: Goal, now: float, costs: Costs) -> bool:
        """Whether the job can keep waiting for the capacity it chose: it has a deadline, and
        the fastest option would still finish, after the worst case of the chosen one, more
        than another wait before it."""
        if goal.deadline_s is None or self.current is None:
            return False
        every = options(goal, self.offers, self.throughput, self.policy, self.observed(now),
                        costs=costs)
        if not every:
            return False
        quickest = min(o.expected_s for o in every)
        return time_in_hand_s(goal, quickest, self.policy, self.current.reserve_s) > \
            self.policy.capacity_wait_s
