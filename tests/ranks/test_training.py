"""The training loop in plain processes: learning, resume, checkpoints, and DDP parity."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain.core.resolve import job_layout
from raytrain.testing.jobs import RecordingSink
from raytrain.testing.runs import _free_port, run_single, small_spec
from raytrain.train.checkpoint import COMMIT_MARKER, latest_checkpoint
from raytrain.train.loop import train
from raytrain.train.progress import ProgressMeter
from raytrain.train.rank import WorkerInfo
from raytrain.train.sync import Heard, LossSync
from tests.support.tolerances import SAME_ORDER, SUM_ORDER


def test_loss_falls_and_checkpoints_are_committed(tmp_path: Path) -> None:
    sink = run_single(small_spec(1, steps=40, checkpoint_every_steps=10), tmp_path)
    losses = sink.losses()
    assert sorted(losses) == list(range(1, 41))
    assert losses[40] < 0.7 * losses[1]
    # Every 10 steps; a periodic save goes on behind training and the next one is skipped
    # while it is still being stored (on a busy host, a cold disk), so 20 or 30 may be missing.
    # The last step's always waits.
    assert sink.checkpoints[0] == 10 and sink.checkpoints[-1] == 40
    assert sink.checkpoints == sorted(set(sink.checkpoints) & {10, 20, 30, 40})
    assert sink.result is not None and sink.result["final_loss"] == losses[40]
    # Two kept; the latest is the last one and carries the data position.
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == [f"step_{step:09d}" for step in sink.checkpoints[-2:]]
    meta = json.loads((latest_checkpoint(tmp_path) / "meta.json").read_text())
    assert meta["samples_seen"] == 40 * 8 and meta["first_loss"] == losses[1]


def test_resume_continues_exactly_where_an_uninterrupted_run_goes(tmp_path: Path) -> None:
    spec = small_spec(1)
    whole = run_single(spec, tmp_path / "whole").losses()
    first = run_single(spec, tmp_path / "cut", stop_after_steps=13)  # last checkpoint: 10
    assert first.checkpoints == [10]
    second = run_single(spec, tmp_path / "cut")
    assert second.started_at == [10]
    resumed = second.losses()
    assert sorted(resumed) == list(range(11, 21))
    for step in resumed:
        assert resumed[step] == pytest.approx(whole[step], abs=SAME_ORDER)
    assert second.result is not None and second.result["first_loss"] == whole[1]


def test_a_new_job_resuming_from_an_old_ones_checkpoint_goes_on_exactly(
        tmp_path: Path) -> None:
    spec = small_spec(1)
    whole = run_single(spec, tmp_path / "whole").losses()
    run_single(spec, tmp_path / "old", stop_after_steps=13)  # stopped: last checkpoint 10
    saved = latest_checkpoint(tmp_path / "old")
    assert saved is not None
    resumed_spec = small_spec(1, resume_from=str(saved))
    resumed = run_single(resumed_spec, tmp_path / "new")  # its own root: empty
    assert resumed.started_at == [10] and sorted(resumed.losses()) == list(range(11, 21))
    for step, loss in resumed.losses().items():
        assert loss == pytest.approx(whole[step], abs=SAME_ORDER)
    assert latest_checkpoint(tmp_path / "new") is not None  # its own from then on
    assert (saved / COMMIT_MARKER).is_file()  # what the service checks at submit


def test_resuming_a_finished_run_reports_its_final_loss(tmp_path: Path) -> None:
    spec = small_spec(1)
    whole = run_single(spec, tmp_path)  # ends with a committed checkpoint at the last step
    again = run_single(spec, tmp_path)  # as after a crash between that and the final report
    assert again.started_at == [20] and again.reports == []
    assert again.result is not None
    assert again.result["final_loss"] == whole.losses()[20]
    assert again.result["steps"] == 20


def test_a_stop_request_ends_the_loop_at_the_next_step(tmp_path: Path) -> None:
    sink = RecordingSink(stop_at_step=5)
    spec = small_spec(1)
    result = train(spec, WorkerInfo.single_process(), sink, tmp_path, layout=job_layout(spec),
                   progress_interval_s=0.0)
    # The request arrives with step 5's report, so step 6 is the last one run.
    assert result["stopped"] and result["steps"] == 6
    assert max(sink.losses()) == 6
    # ... and checkpointed there (a cancel loses no step to a later resume): 6, not the
    # periodic 10 it never reached.
    assert sink.checkpoints == [6] and latest_checkpoint(tmp_path).name == "step_000000006"


def test_loss_sync_spaces_reductions_by_measured_step_time() -> None:
    now = [0.0]
    sync = LossSync(world_size=1, rank=0, target_s=0.5, clock=lambda: now[0])
    due_steps = []
    for step in range(1, 41):
        now[0] += 0.1  # 100 ms steps: about one reduction per 5 steps
        if sync.due(forced=step == 40):
            synced = sync.reduce(torch.tensor(float(step)))
            assert synced.loss == step and synced.heard == Heard()
            due_steps.append(step)
    assert due_steps[:3] == [1, 6, 11] and due_steps[-1] == 40
    every_step = LossSync(world_size=1, rank=0, target_s=0.0, clock=lambda: now[0])
    assert all(every_step.due(forced=False) and every_step.reduce(torch.tensor(1.0))
               for _ in range(5))


def test_bf16_training_follows_fp32_closely(tmp_path: Path) -> None:
    fp32 = run_single(small_spec(1, steps=20), tmp_path / "fp32").losses()
    bf16 = run_single(small_spec(1, steps=20, precision="bf16"), tmp_path / "bf16").losses()
    assert bf16[20] < 0.8 * bf16[1]
    # bf16 keeps 8 bits of mantissa (2^-8 a value): 20 steps of it, not a sum order
    assert bf16[20] == pytest.approx(fp32[20], rel=0.05)
    # The process group a one-device bf16 model made is gone with the run; resumed from
    # its checkpoint in fp32 (a plain module), the job goes on.
    assert not dist.is_initialized()
    resumed = run_single(small_spec(1, steps=24), tmp_path / "bf16").losses()
    assert sorted(resumed) == [21, 22, 23, 24]
    # A run that cannot load its checkpoint fails before its first step, and gives the
    # group back too.
    broken = tmp_path / "broken" / "step_000000005"
    broken.mkdir(parents=True)
    (broken / "meta.json").write_text("{not json")
    (broken / COMMIT_MARKER).write_text("")
    with pytest.raises(BaseException):  # DCP raises a CheckpointException (BaseException)
        run_single(small_spec(1, steps=8, precision="bf16"), tmp_path / "broken")
    assert not dist.is_initialized()


def test_one_device_bf16_computes_in_bf16_parameters_over_fp32_state() -> None:
    """bf16 on one device runs under FSDP2 over a mesh of one (its MixedPrecisionPolicy), as
    every FSDP layout does: each block computes with bf16 parameters, so its output (the
    residual stream) is bf16, where autocast over fp32 weights leaves it fp32 (with autocast
    instead, the dtype assertion fails); the optimizer's parameters and gradients stay fp32;
    and the model ends the process group it made."""
    from raytrain.parallel.parallelize import build_parallel_model

    spec = small_spec(1, precision="bf16")
    model = build_parallel_model(spec, job_layout(spec), torch.device("cpu"))
    # A second model beside it (two runs in threads of one process) shares the group, which
    # outlives the first model's close and ends with the last's.
    beside = build_parallel_model(spec, job_layout(spec), torch.device("cpu"))
    tokens = torch.randint(0, spec.model.gpt.vocab_size, (2, spec.data.seq_len + 1))
    try:
        outputs: list[torch.dtype] = []
        block = next(iter(model.parts[0].layers.values()))
        block.register_forward_hook(lambda _module, _args, out: outputs.append(out.dtype))
        model.forward_backward([tokens])
        assert outputs == [torch.bfloat16]
        assert model.fsdp_units is not None
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == \
            {torch.float32}
    finally:
        model.close()
    assert dist.is_initialized()
    beside.forward_backward([tokens])
    beside.close()
    assert not dist.is_initialized()


def test_uncommitted_checkpoint_is_ignored(tmp_path: Path) -> None:
    spec = small_spec(1)
    run_single(spec, tmp_path, stop_after_steps=10)
    committed = latest_checkpoint(tmp_path)
    assert committed is not None and committed.name == "step_000000010"
    half = tmp_path / "step_000000020"
    half.mkdir()
    (half / "meta.json").write_text("{}")  # written, never committed
    assert latest_checkpoint(tmp_path) == committed
    assert not (tmp_path / "step_000000010" / f"{COMMIT_MARKER}.tmp").exists()


def test_progress_meter_throttles_and_estimates() -> None:
    now = [100.0]
    meter = ProgressMeter(total_steps=10, tokens_per_step=1000, start_step=0,
                          clock=lambda: now[0], interval_s=1.0)
    now[0] = 100.5
    assert meter.record(1, 5.0)  # the first report is always due
    now[0] = 100.9
    assert not meter.record(2, 4.0)
    now[0] = 101.5
    assert meter.record(3, 3.0)
    snapshot = meter.snapshot()
    assert snapshot["tokens_per_s"] == pytest.approx(2000 / 1.0)
    assert snapshot["eta_s"] == pytest.approx(7 * 1000 / 2000)
    assert snapshot["first_loss"] == 5.0
    assert meter.record(10, 1.0)  # the last step is always due


def test_the_step_time_leaves_checkpoint_saves_out_and_the_throughput_does_not() -> None:
    """What the planner predicts is a step; what the job gets counts its saves too."""
    now = [0.0]
    meter = ProgressMeter(total_steps=100, tokens_per_step=1000, start_step=0,
                          clock=lambda: now[0], interval_s=1.0)
    now[0] = 0.1
    assert meter.record(1, 5.0)
    meter.saved(0.5)  # a checkpoint after step 1, in the window that follows
    now[0] = 2.1
    assert meter.record(16, 4.0)  # 15 steps in 2 s, of which 0.5 s saving
    snapshot = meter.snapshot()
    assert snapshot["tokens_per_s"] == pytest.approx(15 * 1000 / 2.0)
    assert snapshot["step_s"] == pytest.approx(1.5 / 15)
    now[0] = 3.1
    assert meter.record(26, 3.0)  # the next window had no save
    assert meter.snapshot()["step_s"] == pytest.approx(1.0 / 10)


# ------------------------------------------------------------------ DDP over gloo parity




def _ddp_worker(rank: int, world_size: int, port: int, root: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        sink = RecordingSink()
        # Reports every 60 s (the first and the last here): every step's loss still arrives,
        # the steps between two loss syncs reduced in one all-reduce.
        spec = small_spec(world_size, steps=10)
        train(spec, WorkerInfo.from_process_group(torch.device("cpu")), sink, Path(root),
              layout=job_layout(spec), progress_interval_s=60.0)
        if rank == 0:
            assert len(sink.reports) == 2
            Path(out).write_text(json.dumps({s: row[1] for s, row in sink.step_rows().items()}))
    finally:
        dist.destroy_process_group()


def test_ddp_on_two_ranks_matches_one_process(tmp_path: Path) -> None:
    reference = run_single(small_spec(1, steps=10), tmp_path / "single").losses()
    out = tmp_path / "ddp.json"
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path / "ddp"), str(out)), nprocs=2)
    ddp = {int(k): v for k, v in json.loads(out.read_text()).items()}
    assert sorted(ddp) == list(range(1, 11))
    for step, loss in reference.items():
        assert ddp[step] == pytest.approx(loss, abs=SUM_ORDER), step


def test_every_step_reaches_the_reports_whatever_their_rate(tmp_path: Path) -> None:
    """Reports once a minute carry every step's loss, learning rate, gradient norm and tokens,
    the same as reports after every step."""
    spec = small_spec(1, steps=20, warmup_steps=5, grad_clip_norm=1.0)
    every = run_single(spec, tmp_path / "every")
    rare = RecordingSink()
    train(spec, WorkerInfo.single_process(), rare, tmp_path / "rare", layout=job_layout(spec),
          progress_interval_s=60.0)
    assert len(rare.reports) == 2 < len(every.reports) == 20
    rows = rare.step_rows()
    assert sorted(rows) == list(range(1, 21))
    assert {s: row[1] for s, row in rows.items()} == every.losses()
    assert rows == every.step_rows()
    # Row s is step s - 1's update: warmup (s) / 5, then the cosine from the peak to 0.1 of it.
    assert [rows[s][2] for s in (1, 5, 6, 7)] == pytest.approx(
        [0.01 / 5, 0.01, 0.01, 0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 15)))])
    assert all(row[3] > 0 and row[4] == spec.tokens_per_step for row in rows.values())
