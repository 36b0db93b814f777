"""Reading spot-fleet traces for the simulator (raytrain.core.simulate).

Three formats, told apart by their lines:
- events: `time_ms,add|remove,node` (Bamboo's AWS p3 and g4dn fleets);
- counts: `time_ms,live_nodes` (Parcae's p3 fleet size);
- dated counts: `YYYY-MM-DD, HH:MM:SS, count` (GCP preemptible instance counts).
Counts become add and remove events; which live node a drop removes is drawn with a fixed
seed, so every run of the simulator sees the same trace.

    trace = load_trace(TRACES_DIR / "bamboo" / "p3-trace.csv")   # raytrain.catalog.TRACES_DIR
"""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

from raytrain.core.fleet import Trace, TraceEvent
from raytrain.errors import FieldError, SpecError

SEED = 0


def load_trace(path: Path, name: str | None = None) -> Trace:
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise SpecError([FieldError(("trace",), f"{path} is empty. To fix: give a trace file")],
                        "simulation")
    fields = [[part.strip() for part in line.split(",")] for line in lines]
    try:
        if len(fields[0]) == 3 and fields[0][1] in ("add", "remove"):
            events = [TraceEvent(float(t) / 1000, kind, node) for t, kind, node in fields]
        elif len(fields[0]) == 2:
            events = _from_counts([(float(t) / 1000, int(c)) for t, c in fields])
        elif len(fields[0]) == 3:
            stamps = [datetime.strptime(f"{d} {t}", "%Y-%m-%d %H:%M:%S") for d, t, _ in fields]
            events = _from_counts([((s - stamps[0]).total_seconds(), int(c))
                                   for s, (_, _, c) in zip(stamps, fields)])
        else:
            raise ValueError("unknown format")
    except ValueError as exc:
        raise SpecError([FieldError(("trace",), f"{path} is not a trace this reads ({exc}). "
                                    "To fix: use time_ms,add|remove,node or time_ms,count or "
                                    "'YYYY-MM-DD, HH:MM:SS, count' lines")], "simulation") from exc
    events.sort(key=lambda e: e.time_s)
    duration = events[-1].time_s + 60.0
    return Trace(name or path.stem, tuple(events), duration)


def _from_counts(counts: list[tuple[float, int]]) -> list[TraceEvent]:
    draw = random.Random(SEED)
    alive: list[str] = []
    made = 0
    events = []
    for t, count in counts:
        while len(alive) < count:
            made += 1
            alive.append(f"node{made}")
            events.append(TraceEvent(t, "add", alive[-1]))
        while len(alive) > count:
            node = alive.pop(draw.randrange(len(alive)))
            events.append(TraceEvent(t, "remove", node))
    return events
