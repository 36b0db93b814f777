"""Replica groups as plain processes, no Ray: each spawned process is one group of one
worker training a job over torchft (a Lighthouse in the caller's process, gloo between the
groups). Files in one folder are the signals and the records: start-G, notice-G, kill-G and
slow are the caller's; ready-G, steps-G.txt (each step a group trains, with the time its
forward and backward ended), losses-G.json, groups-G.json (the groups in each step it led),
result-G.json and events.jsonl the groups'.
tests/ranks/test_elastic_training.py and benchmarks/group_throughput.py drive it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class FileNotice:
    """A node's interruption notice, heard once the file exists (the caller's signal)."""

    noticed_at = None

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def stop_requested(self) -> bool:
        return self.path.exists()

    def take_checkpoint_request(self) -> bool:
        return False


def group_main(group: int, lighthouse: str, folder: str, job: dict[str, Any],
               groups: int, beats: str | None = None, heals: bool = False,
               checkpoints: str | None = None) -> None:
    """One replica group, one process (spawned): train, recording what it sees. `heals`: a
    replacement (ReplicaGroup.heals); `checkpoints`: the job's checkpoint folder, shared by
    the groups as on the service (default: one of the group's own), whose bytes the group
    opens for reading are recorded in read-G.json."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("RUST_LOG", "error")
    import torch
    from torch.distributed import TCPStore

    from raytrain.core.resolve import job_layout
    from raytrain.spec import JobSpec
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import WorkerInfo
    from raytrain.train.replica_group import GroupSetup, ReplicaGroup

    torch.set_num_threads(1)
    out = Path(folder)
    while not (out / f"start-{group}").exists():  # imported and waiting: a node's boot
        time.sleep(0.01)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    spec = JobSpec.model_validate(job)
    layout = job_layout(spec)
    root = Path(checkpoints) if checkpoints else out / f"checkpoints-{group}"
    read = _count_reads(root, out / f"read-{group}.json")

    class Sink(NullSink):
        losses: dict[int, float] = {}
        groups: dict[int, int] = {}

        def progress(self, payload: dict[str, Any]) -> None:
            self.losses[payload["step"]] = payload["loss"]
            self.groups[payload["step"]] = payload["groups"]
            (out / f"losses-{group}.json").write_text(json.dumps(self.losses))
            (out / f"groups-{group}.json").write_text(json.dumps(self.groups))
            # Until the caller has seen the first two groups in one quorum: the first to start
            # waits for the other to be about to train, then steps slowly until it has joined.
            while (out / "slow").exists() and len(list(out.glob("ready-*"))) < 2:
                time.sleep(0.02)
            if (out / "slow").exists():
                time.sleep(0.2)

        def finished(self, result: dict[str, Any]) -> None:
            (out / f"result-{group}.json").write_text(json.dumps(result))


    (out / f"ready-{group}").touch()
    setup = GroupSetup(lighthouse, "127.0.0.1", store.port, "g", groups, timeout_s=30,
                       beats=beats)
    worker = WorkerInfo.single_process()
    members = ReplicaGroup(setup, group, worker, file_events(out, group),
                           die_when=lambda step: _stepped(out, group, step)
                           or (out / f"kill-{group}").exists(), heals=heals)
    try:
        train(spec, worker, Sink(), root, layout=layout,
              notices=FileNotice(out / f"notice-{group}"), progress_interval_s=0.0,
              members=members)
    finally:
        read()


def _count_reads(root: Path, record: Path) -> Any:
    """Count the files under `root` this process opens for reading, and their bytes (an
    audit hook: whatever reads them, DCP's reader included); the returned function writes
    the count to `record`."""
    import sys

    opened: dict[str, int] = {}
    prefix = str(root.resolve())

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not isinstance(args[0], (str, Path)):
            return
        path, mode, flags = str(args[0]), args[1], args[2]
        reading = "r" in mode and "+" not in mode if isinstance(mode, str) \
            else not flags & (os.O_WRONLY | os.O_RDWR)
        if reading and path.startswith(prefix) and os.path.isfile(path):
            opened[path] = os.path.getsize(path)

    sys.addaudithook(hook)

    def write() -> None:
        record.write_text(json.dumps({"files": len(opened), "bytes": sum(opened.values())}))

    return write


def file_events(out: Path, group: int) -> Any:
    """What a leading group reports of the others, appended to events.jsonl."""
    from raytrain.train.replica_group import GroupEvents

    class Events(GroupEvents):
        def report(self, index: int, state: str, step: int, redone_steps: int = 0,
                   stall_s: float | None = None) -> None:
            with open(out / "events.jsonl", "a") as handle:
                handle.write(json.dumps({"group": index, "state": state, "step": step,
                                         "redone": redone_steps, "stall_s": stall_s,
                                         "by": group}) + "\n")

    return Events()


def _stepped(folder: Path, group: int, step: int) -> bool:
    """Record that `group` trains `step` (a step of the quorum it is in), and when."""
    with open(folder / f"steps-{group}.txt", "a") as handle:
        handle.write(f"{step} {time.time():.6f}\n")
    return False


def step_times(folder: Path, group: int) -> list[tuple[int, float]]:
    """(step, time its forward and backward ended) for each step `group` trained."""
    path = folder / f"steps-{group}.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(step), float(at)) for step, at in (line.split() for line in lines
                                                   if len(line.split()) == 2)]


def steps_of(folder: Path, group: int) -> set[int]:
    return {step for step, _ in step_times(folder, group)}


def wait_for_a_step_together(folder: Path, groups: tuple[int, int], timeout_s: float = 120.0
                             ) -> int:
    """The first step both groups trained in one quorum."""
    deadline = time.monotonic() + timeout_s
    while not (common := steps_of(folder, groups[0]) & steps_of(folder, groups[1])):
        assert time.monotonic() < deadline, f"groups {groups} never trained a step together"
        time.sleep(0.02)
    return min(common)


def progress(folder: Path) -> int:
    steps = [0]
    for path in folder.glob("losses-*.json"):
        try:
            steps += [int(k) for k in json.loads(path.read_text())]
        except (OSError, ValueError):
            pass
    return max(steps)


def wait_for_step(folder: Path, step: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while progress(folder) < step:
        assert time.monotonic() < deadline, f"no group reached step {step}"
        time.sleep(0.05)


def start_two_rank_groups(folder: Path, lighthouse: str, job: dict[str, Any],
                          interval_s: float, beats: str | None = None) -> list[Any]:
    """Two replica groups of two ranks each (group_rank_main), spawned and started, in the
    order group 0 rank 0, group 0 rank 1, group 1 rank 0, group 1 rank 1."""
    return [process for group in range(2)
            for process in start_group_of_two(folder, lighthouse, job, group, interval_s,
                                              beats)]


def start_group_of_two(folder: Path, lighthouse: str, job: dict[str, Any], group: int,
                       interval_s: float, beats: str | None = None, heals: bool = False
                       ) -> list[Any]:
    """One replica group of two ranks (group_rank_main), spawned and started, on ports of
    its own: a replacement (`heals`) for a group that left or died takes its index."""
    import multiprocessing

    from raytrain.testing.runs import _free_port

    context = multiprocessing.get_context("spawn")
    ports = (_free_port(), _free_port())
    processes = [context.Process(target=group_rank_main, args=(
        group, rank, lighthouse, str(folder), job, 2, *ports, interval_s, beats, heals),
        daemon=True) for rank in range(2)]
    for process in processes:
        process.start()
    return processes


def wait_until_ended(processes: list[Any], what: str, timeout_s: float = 120.0) -> None:
    """Wait for every one of `processes` to end (a group leaving or dying), `what` naming
    the cause in the failure."""
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in processes):
        assert time.monotonic() < deadline, f"the group did not end on its {what}"
        time.sleep(0.1)


def all_losses(folder: Path) -> dict[int, float]:
    """Every step's loss, as the groups that led it recorded it (losses-G.json)."""
    losses: dict[int, float] = {}
    for path in folder.glob("losses-*.json"):
        losses.update({int(k): v for k, v in json.loads(path.read_text()).items()})
    return losses


def wait_for_groups(folder: Path, group: int, count: int, timeout_s: float = 120.0) -> int:
    """The first step `group` reported with `count` groups in its quorum."""
    deadline = time.monotonic() + timeout_s
    path = folder / f"groups-{group}.json"
    while True:
        try:
            seen = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:  # being written
            seen = {}
        steps = [int(k) for k, v in seen.items() if v == count]
        if steps:
            return min(steps)
        assert time.monotonic() < deadline, f"group {group} never in a quorum of {count}"
        time.sleep(0.05)


def wait_for_event(folder: Path, group: int, state: str, timeout_s: float = 90.0,
                   after: int = 0) -> None:
    """Wait for `group` reported in `state`, in an event after the first `after`."""
    deadline = time.monotonic() + timeout_s
    while not any(e["group"] == group and e["state"] == state
                  for e in events(folder)[after:]):
        assert time.monotonic() < deadline, (group, state, events(folder))
        time.sleep(0.02)


def events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
        else []


def group_rank_main(group: int, rank: int, lighthouse: str, folder: str, job: dict[str, Any],
                    groups: int, pg_port: int, store_port: int, interval_s: float,
                    beats: str | None = None, heals: bool = False) -> None:
    """One rank of a replica group of two ranks (spawned): the group's own gloo process group
    on `pg_port`, its torchft store on `store_port` (rank 0's). Rank 0 hears the service's
    checkpoint interval (`interval_s`); a node's notice (notice-G-R) reaches that rank only,
    as on two nodes, and kill-G-R kills that rank mid-step. `heals`: a replacement
    (ReplicaGroup.heals). Records losses-G.json, checkpoints-G.json (rank 0 of each group)
    and result-G.json."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("RUST_LOG", "error")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(pg_port))
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore

    from raytrain.core.resolve import job_layout
    from raytrain.spec import JobSpec
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import WorkerInfo
    from raytrain.train.replica_group import GroupSetup, ReplicaGroup

    torch.set_num_threads(1)
    out = Path(folder)
    while not (out / f"start-{group}").exists():
        time.sleep(0.01)
    store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False) \
        if rank == 0 else None
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = JobSpec.model_validate(job)

    def kept(name: str) -> dict[int, Any]:  # a replacement adds to its predecessor's record
        path = out / name
        return {int(k): v for k, v in json.loads(path.read_text()).items()} \
            if rank == 0 and path.exists() else {}

    class Sink(NullSink):
        losses: dict[int, float] = kept(f"losses-{group}.json")
        saved: list[int] = []

        groups: dict[int, int] = kept(f"groups-{group}.json")

        def progress(self, payload: dict[str, Any]) -> None:
            self.losses[payload["step"]] = payload["loss"]
            self.groups[payload["step"]] = payload["groups"]
            (out / f"losses-{group}.json").write_text(json.dumps(self.losses))
            (out / f"groups-{group}.json").write_text(json.dumps(self.groups))
            if (out / "slow").exists():
                time.sleep(0.1)

        def checkpoint(self, step: int, path: str, save_s: float,
                       durable_s: float | None = None) -> None:
            self.saved.append(step)
            (out / f"checkpoints-{group}.json").write_text(json.dumps(self.saved))

        def checkpoint_every_s(self) -> float | None:
            return interval_s

        def finished(self, result: dict[str, Any]) -> None:
            (out / f"result-{group}.json").write_text(json.dumps(result))


    setup = GroupSetup(lighthouse, "127.0.0.1", store_port, "g", groups, timeout_s=30,
                       beats=beats)
    try:
        worker = WorkerInfo(rank, 2, torch.device("cpu"))
        train(spec, worker, Sink() if rank == 0 else NullSink(), out / f"ckpt-{group}",
              layout=job_layout(spec), notices=FileNotice(out / f"notice-{group}-{rank}"),
              progress_interval_s=0.0,
              members=ReplicaGroup(setup, group, worker,  # rank 0 reports, as on Ray
                                   file_events(out, group) if rank == 0 else None,
                                   die_when=lambda step: (out / f"kill-{group}-{rank}").exists(),
                                   heals=heals))
    finally:
        dist.destroy_process_group()
        del store


def kill_group(folder: Path, process: Any, group: int) -> None:
    """Kill group `group`'s process through its signal file; return once it is gone (the
    signal taken back, so that a replacement may start)."""
    (folder / f"kill-{group}").touch()
    process.join(60)
    wait_for_event(folder, group, "gone")
    (folder / f"kill-{group}").unlink()


def replace_and_finish(folder: Path, processes: dict[int, Any], replacement: Any,
                       group: int = 1) -> None:
    """Start `replacement` for `group` (processes[2]), wait for it to train, let the groups
    run at full speed, and wait for group 0 and the replacement to end."""
    processes[2] = replacement
    before = len(events(folder))
    replacement.start()
    wait_for_event(folder, group, "training", after=before)
    (folder / "slow").unlink()
    for key in (0, 2):
        processes[key].join(120)


def stop_all(processes: dict[int, Any], lighthouse: Any) -> None:
    for process in processes.values():
        if process.is_alive():
            process.kill()
    lighthouse.shutdown()
