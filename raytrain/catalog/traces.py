"""Reading spot-fleet traces for the simulator (raytrain.sim.replay, raytrain.core.simulate).

Four formats, told apart by their lines:
- events: `time_ms,add|remove,node` (Bamboo's AWS p3 and g4dn fleets);
- counts: `time_ms,live_nodes` (Parcae's p3 fleet size, and any trace converted to counts);
- dated counts: `YYYY-MM-DD, HH:MM:SS, count` (GCP preemptible instance counts);
- JSON lines: `[time_ms, "add"|"remove"|"no-op", {"nodes": [...], "duration": ms}]` (Parcae's
  replay traces).
Counts become add and remove events; which live node a drop removes is drawn with a fixed
seed, so every run of the simulator sees the same trace.

A trace's span is what it states (a comment line `# span_s: 43200`), else its last sample:
the last line of a counts trace (a count that did not change still says the fleet was there
until then), the last event of an events trace, the last sample plus its duration in JSON
lines. Lines starting with `#` are comments; a header line of names (`time_ms,count`) is
skipped. A trace is named after its file; `trace_names` gives files of one name distinct ones.

    trace = load_trace(TRACES_DIR / "bamboo" / "p3-trace.csv")   # raytrain.spec.files.TRACES_DIR
"""

from __future__ import annotations

import json
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Iterable

from raytrain.catalog.spot_trace import Trace, TraceEvent
from raytrain.errors import FieldError, SpecError

__all__ = ["Trace", "TraceEvent", "load_trace", "trace_names"]

SEED = 0
FORMATS = ("time_ms,add|remove,node", "time_ms,count", "'YYYY-MM-DD, HH:MM:SS, count'",
           "JSON lines [time_ms, \"add\"|\"remove\"|\"no-op\", {\"nodes\": [...], "
           "\"duration\": ms}]")
_SPAN = re.compile(r"#\s*span_(s|ms)\s*[:=]\s*([0-9.eE+-]+)")


def load_trace(path: Path, name: str | None = None) -> Trace:
    """The trace in `path` (module doc); SpecError naming the fix for anything else."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise _error(path, f"cannot be read ({exc.strerror or exc}). To fix: give the path of "
                     "a trace file") from exc
    stated_span: float | None = None
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            found = _SPAN.match(line)
            if found:
                stated_span = float(found.group(2)) / (1000 if found.group(1) == "ms" else 1)
            continue
        lines.append(line)
    if lines and not lines[0].startswith("[") and not _numeric(lines[0].split(",")[0]):
        lines = lines[1:]  # a header of column names
    if not lines:
        raise _error(path, "holds no samples. To fix: give a trace with at least one line of "
                     "one of these formats: " + "; ".join(FORMATS))
    try:
        events, last_sample = _parse(lines)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise _error(path, f"is not a trace this reads ({exc}). To fix: use one of these "
                     "formats: " + "; ".join(FORMATS)) from exc
    events.sort(key=lambda e: e.time_s)
    span = stated_span if stated_span is not None else last_sample
    if span <= 0:
        raise _error(path, "spans no time (one sample, and no '# span_s: N' line). To fix: add "
                     "a last sample, or a comment line '# span_s: <seconds>' stating how long "
                     "the trace covers")
    if events and events[-1].time_s > span:
        raise _error(path, f"states a span of {span:g} s but has events until "
                     f"{events[-1].time_s:g} s. To fix: correct the '# span_s' line")
    return Trace(name or path.stem, tuple(events), span)


def trace_names(paths: Iterable[Path]) -> list[str]:
    """A distinct name per file: its stem, or where stems repeat, enough of its path to tell
    them apart (so two runs never share a name in a table or in JSON)."""
    paths = [Path(p) for p in paths]
    names = [p.stem for p in paths]
    for depth in range(1, 8):
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            break
        names = [("/".join(p.with_suffix("").parts[-depth - 1:]) if n in clashes else n)
                 for p, n in zip(paths, names)]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse(lines: list[str]) -> tuple[list[TraceEvent], float]:
    """The events and the time of the last sample, in seconds."""
    if lines[0].startswith("["):
        return _from_json_lines(lines)
    fields = [[part.strip() for part in line.split(",")] for line in lines]
    width = len(fields[0])
    if any(len(f) != width for f in fields):
        bad = next(i for i, f in enumerate(fields) if len(f) != width)
        raise ValueError(f"line {bad + 1} has {len(fields[bad])} fields, the first {width}")
    if width == 3 and fields[0][1] in ("add", "remove"):
        events = []
        for t, kind, node in fields:
            if kind not in ("add", "remove"):
                raise ValueError(f"unknown event {kind!r}")
            events.append(TraceEvent(float(t) / 1000, kind, node))
        return events, max(e.time_s for e in events)
    if width == 2:
        counts = [(float(t) / 1000, int(c)) for t, c in fields]
        return _from_counts(counts), max(t for t, _ in counts)
    if width == 3:
        stamps = [datetime.strptime(f"{d} {t}", "%Y-%m-%d %H:%M:%S") for d, t, _ in fields]
        counts = [((s - stamps[0]).total_seconds(), int(c)) for s, (_, _, c) in zip(stamps, fields)]
        return _from_counts(counts), max(t for t, _ in counts)
    raise ValueError(f"{width} fields a line")


def _from_json_lines(lines: list[str]) -> tuple[list[TraceEvent], float]:
    events: list[TraceEvent] = []
    last = 0.0
    for line in lines:
        t_ms, kind, detail = json.loads(line)
        t = float(t_ms) / 1000
        last = max(last, t + float(detail.get("duration", 0)) / 1000)
        if kind not in ("add", "remove"):
            if detail.get("nodes"):  # a "no-op" or "migration" changes no node
                raise ValueError(f"an event {kind!r} that names nodes")
            continue
        events.extend(TraceEvent(t, kind, str(node)) for node in detail["nodes"])
    return events, last


def _from_counts(counts: list[tuple[float, int]]) -> list[TraceEvent]:
    draw = random.Random(SEED)
    alive: list[str] = []
    made = 0
    events = []
    for t, count in sorted(counts, key=lambda c: c[0]):
        if count < 0:
            raise ValueError(f"a negative count ({count})")
        while len(alive) < count:
            made += 1
            alive.append(f"node{made}")
            events.append(TraceEvent(t, "add", alive[-1]))
        while len(alive) > count:
            node = alive.pop(draw.randrange(len(alive)))
            events.append(TraceEvent(t, "remove", node))
    return events


def _error(path: Path, problem: str) -> SpecError:
    return SpecError([FieldError(("trace",), f"{path} {problem}")], "simulation")
