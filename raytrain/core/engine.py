"""One job's capacity engine: the policy (raytrain.core.autoscale) with what it has to
remember between decisions, fed events and answering decisions. The live service's
provisioner and the simulator drive this same object through the same calls, so a policy
measured on a trace is the policy a job gets.

Events: the job is submitted ("submit"), its capacity is preempted ("preemption"), the
capacity it asked for did not come in time ("capacity-missing"), time passed or prices
changed ("progress", "prices"); spot exposure is reported as it happens (`exposed`, per
offer: preemptions and node-hours held) and capacity found again (`capacity_back`). Each
event returns a `Decision`: start, stay, switch (now, or at a checkpoint) or wait, with the
checkpoint interval of the capacity chosen. Pure: values in, values out, no clock.

    engine = CapacityEngine(policy, offers, throughput)
    decision = engine.on("submit", goal)
    engine.exposed(offer.id, preempted=1)       # counted first, as the live tally does
    decision = engine.on("preemption", goal)
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from raytrain.spec import Offer, PolicySpec

EVENTS = ("submit", "preemption", "capacity-missing", "progress", "prices")


@dataclass
class CapacityEngine:
    policy: PolicySpec
    offers: list[Offer]
    throughput: Throughput
    # Per offer: (preemptions, spot node-hours), this job's and (live) the service's others'.
    history: dict[str, tuple[int, float]] = field(default_factory=dict)
    current: Option | None = None  # the capacity last decided on
    unavailable: frozenset[tuple[str, str]] = frozenset()  # (offer id, market) found missing
    preemptions: int = 0  # of this job

    @property
    def observed(self) -> Observed:
        return Observed(spot_history=dict(self.history), preemptions=self.preemptions,
                        unavailable=self.unavailable)

    def exposed(self, offer_id: str, preempted: int = 0, node_hours: float = 0.0) -> None:
        """This job held spot capacity of `offer_id` for `node_hours`, and lost it
        `preempted` times. (The live service counts this in its tally for every job, which
        `history` is; a simulation reports it here.)"""
        count, hours = self.history.get(offer_id, (0, 0.0))
        self.history[offer_id] = (count + preempted, hours + node_hours)
        self.preemptions += preempted

    def capacity_back(self, found: set[tuple[str, str]]) -> None:
        """Capacity found missing before is there again: (offer id, market) pairs."""
        self.unavailable = self.unavailable - found

    def on(self, event: str, goal: Goal) -> Decision:
        """Decide on `event` (one of EVENTS) for what is left of the job (`goal`)."""
        assert event in EVENTS, event
        if event == "capacity-missing" and self.current is not None:
            if self._time_in_hand(goal):
                return Decision("stay", self.current, "capacity missing, time in hand: waiting")
            self.unavailable = self.unavailable | {(self.current.offer.id,
                                                    self.current.market)}
        if self.current is None or event == "submit":
            decision = choose(goal, self.offers, self.throughput, self.policy, self.observed)
        else:
            decision = redecide(self.current, event, goal, self.offers, self.throughput,
                                self.policy, self.observed)
        if decision.option is not None and decision.action in ("start", "switch", "stay"):
            self.current = decision.option
        return decision

    def _time_in_hand(self, goal: Goal) -> bool:
        """Whether the job can keep waiting for the capacity it chose: it has a deadline, and
        the fastest option would still finish the fallback's slack before it."""
        if goal.deadline_s is None or self.current is None:
            return False
        every = options(goal, self.offers, self.throughput, self.policy, self.observed)
        if not every:
            return False
        quickest = min(o.expected_s for o in every)
        return time_in_hand_s(goal, quickest, self.policy) > self.policy.capacity_wait_s
