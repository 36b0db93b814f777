"""A spot fleet's recorded life, as values: when each node came and went, over the trace's
span. Read from files by raytrain.catalog.traces; replayed by raytrain.core.fleet."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceEvent:
    time_s: float
    kind: str  # add | remove
    node: str


@dataclass(frozen=True)
class Trace:
    """A spot fleet's recorded life: its events over `duration_s` (the trace's span)."""

    name: str
    events: tuple[TraceEvent, ...]
    duration_s: float

    @property
    def max_nodes(self) -> int:
        """The most nodes the fleet ever had alive at once."""
        alive, most = set(), 0
        for event in self.events:
            if event.kind == "add":
                alive.add(event.node)
            else:
                alive.discard(event.node)
            most = max(most, len(alive))
        return most

    def alive_at(self, time_s: float) -> list[str]:
        """The nodes alive at `time_s`, events at that time included, sorted by name."""
        alive: set[str] = set()
        for event in self.events:
            if event.time_s > time_s:
                break
            if event.kind == "add":
                alive.add(event.node)
            else:
                alive.discard(event.node)
        return sorted(alive)
