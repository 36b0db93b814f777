"""Checkpoints, logs and job records in an S3 bucket, against a real S3 server on 127.0.0.1
(moto's server mode, through boto3 over HTTP): atomic commits, background uploads, resume,
retention, killed uploads, a store that is down, the errors a user gets, and a new head node
that recovers every job from the bucket alone."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from raytrain.cloud.object_store import S3Store, open_store
from raytrain.errors import RaytrainError, SpecError, StoreError
from raytrain.serve.jobs.durable import acquire_lease
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import JobSpec, JobState, ServiceConfig
from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.runs import run_single, small_spec
from raytrain.testing.s3_server import make_bucket, s3_server
from raytrain.train.checkpoint import CheckpointManager, committed_steps
from raytrain.train.worker_logs import read_stored_logs, stored_output
from tests.support.tolerances import SAME_ORDER, SUM_ORDER


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_server() as url:
        make_bucket(url, "jobs")
        yield url


def _model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


def test_a_job_checkpoints_resumes_and_is_retained_in_a_bucket(endpoint: str,
                                                               tmp_path: Path) -> None:
    """Cut at step 13 and resumed from the bucket, the run's losses are the uninterrupted
    run's; the bucket keeps the `keep_checkpoints` newest, each committed."""
    spec = small_spec(1, steps=30, keep_checkpoints=2)
    whole = run_single(spec, tmp_path / "whole").losses()
    root = "s3://jobs/resume/ab12/checkpoints"
    first = run_single(spec, root, stop_after_steps=13)  # last checkpoint: 10
    assert first.checkpoints == [10]
    rest = run_single(spec, root)
    assert rest.started_at == [10]
    assert rest.losses() == pytest.approx({s: whole[s] for s in range(11, 31)}, abs=SAME_ORDER)
    assert committed_steps(open_store(root)) == [20, 30]
    names = {key.split("/")[0] for key in open_store(root).keys("")}
    assert names == {"step_000000020", "step_000000030"}  # older ones removed


def test_uploads_killed_at_random_points_leave_nothing_loadable(endpoint: str) -> None:
    """10 saves, each stopped dead after a seeded number of bucket writes (objects are
    atomic in S3, so a killed process leaves exactly such a prefix of its writes): the latest
    committed checkpoint is always a whole one, and the next save still succeeds. Without
    the commit marker (a checkpoint counted once its shards are there) it fails."""

    class Killed(BaseException):
        pass

    class Dying(S3Store):
        def __init__(self, uri: str, writes: int) -> None:
            super().__init__(uri)
            self.writes = writes

        def put_bytes(self, key: str, data: bytes) -> None:
            self._tick()
            super().put_bytes(key, data)

        def put_file(self, path: Path, key: str) -> None:
            self._tick()
            super().put_file(path, key)

        def _tick(self) -> None:
            self.writes -= 1
            if self.writes < 0:
                raise Killed()

    rng = random.Random(20)
    root = "s3://jobs/killed/ab12/checkpoints"
    model, optimizer = _model()
    manager = CheckpointManager(root, 0, keep=2, asynchronous=False)
    manager.save(1, [model], [optimizer], {"samples_seen": 1})
    saved = {1: _model()[0]}
    killed = 0
    for attempt in range(10):
        step = 2 + attempt
        model, optimizer = _model(seed=step)
        dying = CheckpointManager(root, 0, keep=2, asynchronous=False)
        dying.store = Dying(root, rng.randint(0, 7))  # 6 writes make a whole checkpoint
        try:
            dying.save(step, [model], [optimizer], {"samples_seen": step})
            saved[step] = model
        except Killed:
            killed += 1
        latest = CheckpointManager(root, 0).latest()
        assert latest is not None
        loaded, loaded_optimizer = _model(seed=999)
        meta = CheckpointManager(root, 0).load(latest, [loaded], [loaded_optimizer])
        assert _same(loaded, saved[meta["step"]])
    assert 5 <= killed < 10  # most killed part-way, some whole (seeded: 8 and 2)
    model, optimizer = _model(seed=77)
    CheckpointManager(root, 0, keep=2).save(50, [model], [optimizer], {}, wait=True)
    assert committed_steps(open_store(root))[-1] == 50


def test_saving_goes_on_behind_training_and_a_store_outage_fails_nothing(
        endpoint: str) -> None:
    """The upload runs after save() returns; while the store is down it is retried, later
    periodic saves are skipped rather than waited for, and once the store answers the
    checkpoint is committed and reported with its stall and its time to durability."""
    root = "s3://jobs/outage/ab12/checkpoints"
    durable: list[tuple[int, float, float]] = []
    manager = CheckpointManager(root, 0, keep=2, retry_first_s=0.05,
                                on_durable=lambda s, ref, stall, d: durable.append((s, stall, d)))
    down = threading.Event()
    down.set()
    calls = {"failed": 0}
    real = manager.store.put_file

    def flaky(path: Path, key: str) -> None:
        if down.is_set():
            calls["failed"] += 1
            raise StoreError(root, f"uploading {key}", "connection refused")
        real(path, key)

    manager.store.put_file = flaky  # type: ignore[method-assign]
    model, optimizer = _model()
    stall = manager.save(10, [model], [optimizer], {})
    assert stall is not None and manager.busy
    assert manager.save(20, [model], [optimizer], {}) is None  # skipped: 10 still uploading
    deadline = time.monotonic() + 30
    while calls["failed"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert committed_steps(open_store(root)) == [] and durable == []
    down.clear()
    manager.flush()
    assert committed_steps(open_store(root)) == [10]
    [(step, stalled, to_durable)] = durable
    assert step == 10 and stalled == stall and to_durable > stalled


def test_worker_logs_outlive_their_node(endpoint: str, tmp_path: Path) -> None:
    """A rank's output reaches the bucket while it runs and when it ends, and reads back
    through the same offsets as a local log."""
    uri = "s3://jobs/logs/ab12/logs"
    with stored_output(uri, rank=3, header="attempt 1", every_s=0.1):
        os.write(1, b"step 1 loss 4.2\n")
        deadline = time.monotonic() + 20
        while not any("loss 4.2" in c.text for c in read_stored_logs(uri)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        print("the end", flush=True)
    [chunk] = read_stored_logs(uri, rank=3)
    assert "attempt 1" in chunk.text and "the end" in chunk.text
    assert read_stored_logs(uri, offsets={3: chunk.offset})[0].text == ""


def test_storage_errors_name_the_fix(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No bucket, no credentials, no endpoint, another scheme: each refused with its fix."""
    with pytest.raises(SpecError, match="create the bucket"):
        open_store("s3://no-such-bucket/x", check=True)
    with pytest.raises(SpecError, match="check the endpoint"):
        open_store("s3://jobs/x", endpoint="http://127.0.0.1:1", check=True)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SpecError, match="set credentials"):
        open_store("s3://jobs/x", check=True)
    with pytest.raises(ValueError, match="gs:// is not a storage"):
        ServiceConfig(storage_path="gs://bucket/x")


def _job(steps: int, name: str) -> dict[str, Any]:
    return {"name": name,
            "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 16}},
            "data": {"seq_len": 16},
            "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 4,
                         "checkpoint_every_steps": 10, "learning_rate": 0.01},
            "resources": {"num_workers": 1, "cpus_per_worker": 1}}


class _GoneHead:
    """The lost head's job manager: every report from a run still going raises."""

    def __getattr__(self, name: str) -> Any:
        raise ConnectionError("the head node is gone")


def test_a_new_head_recovers_every_job_from_the_bucket_and_finishes_the_running_one(
        endpoint: str, tmp_path: Path) -> None:
    """The head is lost while one job has ended, one trains (checkpointed) and one waits. A
    service started on an empty state directory with the same bucket lists all three,
    resumes the running one from its checkpoint, runs the queued one, and both end as an
    uninterrupted run would. A third service on the same bucket is refused, naming the one
    that holds it."""
    storage = "s3://jobs/service"
    first = ServiceConfig(state_dir=str(tmp_path / "head1"), storage_path=storage,
                          storage_lease_s=2.0, scheduler_interval_s=0.05)
    cluster = TrainingRay(cpus=1, hold_at=30)
    manager = cluster.manager = JobManager(first.model_dump(mode="json"), cluster=cluster,
                                           schedule=False).start()
    ids = [manager.submit(JobSpec.model_validate(_job(steps, name))).id
           for steps, name in ((10, "done"), (60, "running"), (20, "queued"))]
    done, running, queued = ids
    deadline = time.monotonic() + 120
    while not cluster.held.is_set():  # "done" ends, "running" reaches step 30
        assert time.monotonic() < deadline and not cluster.errors, cluster.errors
        manager.scheduler.pass_once()
        time.sleep(0.02)
    assert manager.records[done].status.state == JobState.SUCCEEDED
    saved_before_loss = manager.records[running].status.checkpoint.step
    assert saved_before_loss >= 10
    # The head goes: its job manager, its disk and its mirror thread stop; the run dies.
    manager._store.stop_mirror()  # noqa: SLF001 - what a lost head does
    cluster.manager = _GoneHead()
    cluster.go.set()

    second = first.model_copy(update={"state_dir": str(tmp_path / "head2")})
    cluster2 = TrainingRay(cpus=1)
    again = cluster2.manager = JobManager(second.model_dump(mode="json"), cluster=cluster2,
                                          schedule=False).start()
    assert set(again.records) == set(ids)
    assert again.records[done].status.state == JobState.SUCCEEDED
    with pytest.raises(RaytrainError, match="another raytrain service drives"):
        acquire_lease(open_store(storage), "someone-else", 2.0)
    deadline = time.monotonic() + 180
    while not all(again.records[i].status.state.is_terminal for i in ids):
        assert time.monotonic() < deadline and not cluster2.errors, cluster2.errors
        again.scheduler.pass_once()
        time.sleep(0.02)
    resumed = again.records[running].status
    assert resumed.state == JobState.SUCCEEDED, resumed.error
    # It went on from a checkpoint, not from the start (which ends at the same loss too): the
    # new head saw its steps from just after the checkpoint it resumed from.
    steps = [row["step"] for row in json.loads(again.history(running) or "{}")["steps"]]
    assert steps and steps[0] > saved_before_loss and steps[-1] == 60
    assert steps == list(range(steps[0], 61))
    assert again.records[queued].status.state == JobState.SUCCEEDED
    reference = run_single(JobSpec.model_validate(_job(60, "running")), tmp_path / "reference")
    assert resumed.result.final_loss == pytest.approx(reference.result["final_loss"],
                                                      abs=SUM_ORDER)
    again.shutdown()


def test_two_heads_racing_for_the_lease_leave_exactly_one_holding_it(endpoint: str) -> None:
    """Both start at once on an empty bucket; each that gets the lease renews it. Exactly
    one holds it, the other is refused naming the holder. (With the lease read, then
    written, both took it: each learned otherwise only at its next renewal.)"""
    from raytrain.serve.jobs.durable import renew_lease

    store = open_store("s3://jobs/race")
    results: dict[str, str] = {}
    stop, barrier = threading.Event(), threading.Barrier(2)

    def head(name: str) -> None:
        barrier.wait()
        try:
            tag = acquire_lease(store, name, 1.0)
            results[name] = "holds"
            while not stop.wait(0.2):
                tag = renew_lease(store, name, tag)
        except RaytrainError as exc:  # refused, or (a defect) taken over after holding it
            results[name] = f"lost: {exc}" if results.get(name) == "holds" else str(exc)

    threads = [threading.Thread(target=head, args=(n,), daemon=True) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(results) < 2:
        assert time.monotonic() < deadline, results
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(10)
    [winner] = [n for n, r in results.items() if r == "holds"]
    [loser] = [r for n, r in results.items() if n != winner]
    assert "another raytrain service drives" in loser and f"service {winner}" in loser


def test_a_lapsed_lease_is_taken_over_and_its_old_holder_stops(endpoint: str) -> None:
    """A head that stopped renewing: a new one waits a lease's time by its own clock, takes
    the lease over, and the old one's next renewal fails (it stops writing)."""
    from raytrain.serve.jobs.durable import renew_lease

    store = open_store("s3://jobs/lapsed")
    old_tag = acquire_lease(store, "old-head", 1.0)
    lines: list[str] = []
    new_tag = acquire_lease(store, "new-head", 1.0, progress=lines.append)
    assert new_tag != old_tag and "leased by service old-head" in lines[0]
    with pytest.raises(RaytrainError, match="new-head .* took over"):
        renew_lease(store, "old-head", old_tag)
    assert renew_lease(store, "new-head", new_tag)


def test_a_cold_start_on_two_ranks_reads_each_ranks_half_of_the_checkpoint(
        endpoint: str, tmp_path: Path) -> None:
    """Two FSDP ranks checkpoint to the bucket, then load it again as a cold start does:
    each rank fetches the ranges of its own shards (and the small metadata), about half of
    the checkpoint, not all of it as when every rank downloaded every object (the bounds
    fail with that: 100% each)."""
    import torch.multiprocessing as mp

    from raytrain.testing.runs import _free_port, cold_start_reads

    job = {"name": "reads",
           "model": {"gpt": {"vocab_size": 2048, "dim": 128, "num_layers": 2, "num_heads": 4,
                             "max_seq_len": 16}},
           "data": {"seq_len": 16}, "parallel": {"strategy": "fsdp"},
           "training": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2,
                        "checkpoint_every_steps": 2},
           "resources": {"num_workers": 2}}
    root = "s3://jobs/cold-start/checkpoints"
    mp.spawn(cold_start_reads, args=(2, _free_port(), job, root, str(tmp_path)), nprocs=2)
    reads = [json.loads((tmp_path / f"read-{rank}.json").read_text()) for rank in (0, 1)]
    store = open_store(root)
    name = reads[0]["checkpoint"].rstrip("/").rpartition("/")[2]
    total = sum(len(store.get_bytes(key) or b"") for key in store.keys(f"{name}/"))
    shares = [r["bytes"] / total for r in reads]
    print(f"\na cold start on 2 FSDP ranks: rank 0 read {reads[0]['bytes']:,} bytes, rank 1 "
          f"{reads[1]['bytes']:,}, of a {total:,}-byte checkpoint "
          f"({shares[0]:.0%}, {shares[1]:.0%})")
    # Half of the shards, and what both ranks need: the metadata, and the replicated
    # optimizer step counts (a few hundred KB here).
    assert all(0.4 < share < 0.6 for share in shares), shares


def test_a_job_trains_on_token_shards_in_a_bucket_as_on_the_same_folder(
        endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token shards (the folder `raytrain data prepare` writes) uploaded to a bucket: a job
    with data.path the prefix trains the losses of the same job on the folder, bit for bit;
    a batch fetches exactly its windows' bytes into the node's cache, and reading it again
    (another epoch, another run on the node) fetches nothing; a prefix with no index is
    refused at submit naming data.path."""
    from raytrain.data.shards import TokenShards
    from raytrain.serve.jobs.admission import check_paths_on_head_node

    folder = tmp_path / "shards"
    folder.mkdir()
    stream = np.random.default_rng(0).integers(0, 300, size=3 * 500, dtype=np.uint16)
    shards = []
    for n in range(3):  # 3 shards of 500 tokens: windows of 17 cross their boundaries
        (folder / f"shard-{n:05d}.bin").write_bytes(stream[n * 500:(n + 1) * 500].tobytes())
        shards.append({"file": f"shard-{n:05d}.bin", "tokens": 500})
    (folder / "index.json").write_text(json.dumps(
        {"version": 1, "dtype": "uint16", "vocab_size": 300, "tokens": 1500,
         "shards": shards}))
    prefix = "s3://jobs/corpora/tiny"
    bucket = open_store(prefix)
    for path in folder.iterdir():
        bucket.put_file(path, path.name)

    def job(path: str) -> JobSpec:
        return JobSpec.model_validate({
            "model": {"gpt": {"vocab_size": 300, "dim": 32, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 16}},
            "data": {"kind": "token_file", "path": path, "seq_len": 16, "shuffle": True},
            "training": {"steps": 12, "global_batch_size": 8, "micro_batch_size": 4,
                         "learning_rate": 0.01},
            "resources": {"num_workers": 1}})

    local = run_single(job(str(folder)), tmp_path / "local").losses()
    remote = run_single(job(prefix), tmp_path / "remote").losses()
    assert remote == local  # the same tokens, so the same floats

    monkeypatch.setenv("RAYTRAIN_DATA_CACHE", str(tmp_path / "cache"))  # a node's, empty
    source = TokenShards(prefix, seq_len=16, vocab_size=300, shuffle=True)
    batch = source.batch(range(8, 16))
    assert torch.equal(batch, TokenShards(str(folder), 16, 300, shuffle=True).batch(
        range(8, 16)))
    assert source.bytes_read == 8 * 17 * 2  # its 8 windows, nothing more
    again = TokenShards(prefix, seq_len=16, vocab_size=300, shuffle=True)
    assert torch.equal(again.batch(range(8, 16)), batch) and again.bytes_read == 0
    check_paths_on_head_node(job(prefix), endpoint)  # a prefix with its index: accepted
    with pytest.raises(SpecError) as refused:
        check_paths_on_head_node(job("s3://jobs/corpora/missing"), endpoint)
    assert refused.value.errors[0].loc == ("data", "path")
    assert "no readable index.json" in str(refused.value)


def test_data_prepare_writes_its_shards_to_a_bucket_as_to_a_folder(
        endpoint: str, tmp_path: Path) -> None:
    """`raytrain data prepare ... --out s3://...` puts the same shards and index in the bucket
    as it writes to a folder, byte for byte."""
    from raytrain.cli.parser import main
    from tests.support.corpus import inputs, tokenizer_file

    tokenizer, files = tokenizer_file(tmp_path), inputs(tmp_path)
    prefix = "s3://jobs/corpora/prepared"
    for out in (str(tmp_path / "folder"), prefix):
        assert main(["data", "prepare", *files, "--tokenizer", str(tokenizer), "--out", out,
                     "--shard-tokens", "500"]) == 0
    folder, bucket = tmp_path / "folder", open_store(prefix)
    local = sorted(p.name for p in folder.iterdir())
    assert len(local) > 2 and sorted(bucket.keys("")) == local
    for name in local:
        assert bucket.get_bytes(name) == (folder / name).read_bytes(), name


def test_chat_shards_in_a_bucket_mask_as_in_a_folder(endpoint: str, tmp_path: Path) -> None:
    """`data prepare --chat` to a bucket puts each shard's spans beside it; a rank reading
    the prefix marks the same targets untrained, and counts the same trained targets, as
    one reading the folder."""
    from raytrain.data.prepare import prepare
    from raytrain.data.shards import TokenShards
    from tests.support.corpus import CHATML, chat_inputs

    tokenizer, files = chat_inputs(tmp_path, CHATML)
    prefix = "s3://jobs/corpora/chats"
    for out in (str(tmp_path / "folder"), prefix):
        prepare(files, str(tokenizer), out, shard_tokens=300, chat=True)
    local = TokenShards(str(tmp_path / "folder"), 16, None, shuffle=True)
    remote = TokenShards(prefix, 16, None, shuffle=True)
    batch = remote.batch(range(24))
    assert torch.equal(batch, local.batch(range(24))) and bool((batch < 0).any())
    assert remote.trained(range(24)) == local.trained(range(24)) == int((batch[:, 1:] >= 0).sum())
