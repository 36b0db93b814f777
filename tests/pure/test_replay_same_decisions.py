"""The replay's differential test: every replay of raytrain/testing/replay_cases.py decides,
at the same simulated times, and bills what the replay did before its clock jumped from
event to event and its store writes were left out (the fingerprints in
tests/data/replay_golden.json, written by that code at 46ec4bb). A change of what the service
decides, made on purpose, writes the file again in the commit that makes it and says why
(`python -m raytrain.testing.replay_cases tests/data/replay_golden.json`): since 46ec4bb, once,
when a replica group lost without a notice had its replacement asked for at once. A pass
the faster replay skipped that would have decided something, a report it left out, or a
bill summed differently fails it
(checked: Scheduler.idle_until answering 600 s late fails it, and so do progress reports
every 31 s of simulated time rather than 30)."""

from __future__ import annotations

import json
import math
from typing import Any

from raytrain.testing.replay_cases import GOLDEN, run_all


def same(old: Any, new: Any, where: str) -> list[str]:
    if isinstance(old, float) or isinstance(new, float):
        if old is None or new is None or not math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-6):
            return [f"{where}: {old!r} then, {new!r} now"]
        return []
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} entries then, {len(new)} now: {new!r}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in same(a, b, f"{where}[{i}]")]
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(old.keys() | new.keys())
                for d in same(old.get(key), new.get(key), f"{where}.{key}")]
    return [] if old == new else [f"{where}: {old!r} then, {new!r} now"]


def test_the_replay_decides_and_bills_what_it_did_before_it_was_made_fast() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = run_all()
    assert now.keys() == golden.keys()
    differences = [d for name in golden for d in same(golden[name], now[name], name)]
    assert not differences, "\n".join(differences[:20])
