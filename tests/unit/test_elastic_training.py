"""Replica groups that outlive each other, for real: processes training one small GPT as
replica groups over torchft (a Lighthouse in this process, gloo between the groups), no Ray.
Two groups start; one leaves on a notice; a third starts and heals from a live group; the
first is killed mid-step; a fourth heals and joins. The losses, step by step, are those of
one process training alone, to 1e-5, and the leading group's reports say what each change
cost. Files are the test's signals (notice-G, kill-G) and the groups' records."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from raytrain.spec import JobSpec
from tests.unit.test_training import run_single

STEPS = 60
JOB = {"name": "elastic",
       "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                         "max_seq_len": 16}},
       "data": {"seq_len": 16},
       "training": {"steps": STEPS, "global_batch_size": 12, "micro_batch_size": 2,
                    "checkpoint_every_steps": 1000, "learning_rate": 0.01},
       "resources": {"num_workers": 1}}
GROUPS = 4


def _group_main(group: int, lighthouse: str, folder: str) -> None:
    """One replica group, one process (spawned): train, recording what it sees."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("RUST_LOG", "error")
    import torch
    from torch.distributed import TCPStore

    from raytrain.core.resolve import job_layout
    from raytrain.train.elastic import GroupEvents, GroupSetup, train_group
    from raytrain.train.loop import WorkerInfo
    from raytrain.train.progress import NullSink

    torch.set_num_threads(1)
    out = Path(folder)
    while not (out / f"start-{group}").exists():  # imported and waiting: a node's boot
        time.sleep(0.01)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    spec = JobSpec.model_validate(JOB)
    layout = job_layout(spec)

    class Sink(NullSink):
        losses: dict[int, float] = {}

        def progress(self, payload: dict[str, Any]) -> None:
            self.losses[payload["step"]] = payload["loss"]
            (out / f"losses-{group}.json").write_text(json.dumps(self.losses))
            # Until the test has seen the first two groups in one quorum: the first to start
            # waits for the other to be about to train, then steps slowly until it has joined.
            while (out / "slow").exists() and len(list(out.glob("ready-*"))) < 2:
                time.sleep(0.02)
            if (out / "slow").exists():
                time.sleep(0.2)

        def finished(self, result: dict[str, Any]) -> None:
            (out / f"result-{group}.json").write_text(json.dumps(result))

    class Notice:
        noticed_at = None

        @property
        def stop_requested(self) -> bool:
            return (out / f"notice-{group}").exists()

        def take_checkpoint_request(self) -> bool:
            return False

    class Events(GroupEvents):
        def report(self, index: int, state: str, step: int, redone_steps: int = 0,
                   stall_s: float | None = None) -> None:
            with open(out / "events.jsonl", "a") as handle:
                handle.write(json.dumps({"group": index, "state": state, "step": step,
                                         "redone": redone_steps, "stall_s": stall_s,
                                         "by": group}) + "\n")

    (out / f"ready-{group}").touch()
    setup = GroupSetup(lighthouse, "127.0.0.1", store.port, "g", GROUPS, timeout_s=30)
    train_group(spec, layout, WorkerInfo.single_process(), group, setup, Sink(),
                out / f"checkpoints-{group}", Notice(), Events(), progress_interval_s=0.0,
                die_when=lambda step: _stepped(out, group, step)
                or (out / f"kill-{group}").exists())


def _stepped(folder: Path, group: int, step: int) -> bool:
    """Record that `group` trains `step` (a step of the quorum it is in)."""
    with open(folder / f"steps-{group}.txt", "a") as handle:
        handle.write(f"{step}\n")
    return False


def _steps_of(folder: Path, group: int) -> set[int]:
    path = folder / f"steps-{group}.txt"
    return {int(line) for line in path.read_text().split()} if path.exists() else set()


def _wait_for_a_step_together(folder: Path, groups: tuple[int, int], timeout_s: float = 120.0
                              ) -> int:
    """The first step both groups trained in one quorum."""
    deadline = time.monotonic() + timeout_s
    while not (common := _steps_of(folder, groups[0]) & _steps_of(folder, groups[1])):
        assert time.monotonic() < deadline, f"groups {groups} never trained a step together"
        time.sleep(0.02)
    return min(common)


def _progress(folder: Path) -> int:
    steps = [0]
    for path in folder.glob("losses-*.json"):
        try:
            steps += [int(k) for k in json.loads(path.read_text())]
        except (OSError, ValueError):
            pass
    return max(steps)


def _wait_for_step(folder: Path, step: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _progress(folder) < step:
        assert time.monotonic() < deadline, f"no group reached step {step}"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_groups_leave_die_and_join_and_train_exactly_as_one_process(tmp_path: Path) -> None:
    from torchft.coordination import LighthouseServer

    os.environ.setdefault("RUST_LOG", "error")
    reference = run_single(JobSpec.model_validate(JOB), tmp_path / "reference")
    expected = reference.losses()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200,
                                  heartbeat_timeout_ms=1500)
    context = multiprocessing.get_context("spawn")
    processes: dict[int, Any] = {}

    for group in range(GROUPS):  # all imported up front; each starts when told
        processes[group] = context.Process(target=_group_main, args=(
            group, lighthouse.address(), str(tmp_path)), daemon=True)
        processes[group].start()

    def start(group: int) -> None:
        (tmp_path / f"start-{group}").touch()

    try:
        # The first group to start trains alone until the other joins (its boot may take
        # seconds on a busy host); it is held back until then, so the job is not over.
        (tmp_path / "slow").touch()
        start(0)
        start(1)
        together = _wait_for_a_step_together(tmp_path, (0, 1))
        (tmp_path / "slow").unlink()
        _wait_for_step(tmp_path, together + 3)
        (tmp_path / "notice-1").touch()  # group 1's node is being taken: it leaves
        _wait_for_event(tmp_path, 1, "gone")
        start(2)  # a replacement: heals from group 0 and joins
        _wait_for_event(tmp_path, 2, "training")
        (tmp_path / "kill-0").touch()  # group 0 dies mid-step, without notice
        processes[0].join(60)
        _wait_for_event(tmp_path, 0, "gone")
        start(3)
        _wait_for_event(tmp_path, 3, "training")
        for group in (1, 2, 3):
            processes[group].join(120)
    finally:
        for process in processes.values():
            if process.is_alive():
                process.kill()
        lighthouse.shutdown()
    assert processes[0].exitcode == 17 and processes[1].exitcode == 0
    assert not (tmp_path / "result-1.json").exists()  # a group that left is not the job's end
    losses: dict[int, float] = {}
    for path in tmp_path.glob("losses-*.json"):
        losses.update({int(k): v for k, v in json.loads(path.read_text()).items()})
    assert sorted(losses) == list(range(1, STEPS + 1))  # every step once, none skipped
    for step, loss in losses.items():
        assert loss == pytest.approx(expected[step], abs=1e-5), step
    for group in (2, 3):
        assert json.loads((tmp_path / f"result-{group}.json").read_text())["steps"] == STEPS
    events = _events(tmp_path)
    gone = {e["group"]: e for e in events if e["state"] == "gone"}
    assert gone[1]["redone"] == 0  # it left at a step boundary
    assert gone[0]["redone"] <= 1  # the step in flight, at most
    assert {e["group"] for e in events if e["state"] == "training"} >= {2, 3}
    (tmp_path / "stalls.json").write_text(json.dumps(events))
    print("events:", json.dumps(events))


def _wait_for_event(folder: Path, group: int, state: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e["group"] == group and e["state"] == state for e in _events(folder)):
        assert time.monotonic() < deadline, (group, state, _events(folder))
        time.sleep(0.02)


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []
