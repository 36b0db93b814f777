"""Fine-tuning shards in a bucket (moto's S3 server), read by replica groups that lose one
of theirs mid-run: two groups on gloo (plain processes over torchft, no Ray), the masked,
shuffled windows fetched through the node's cache; group 1 is killed and a replacement
heals from group 0. Every step's loss equals one process's on the same prefix to 1e-5, so
every step trained on the same samples as an uninterrupted run (a group that read another
step's samples fails it)."""

from __future__ import annotations

import multiprocessing
import os
from functools import partial
from pathlib import Path

import pytest

from raytrain.data.prepare import prepare
from raytrain.spec import JobSpec
from raytrain.testing.elastic_groups import (
    all_losses,
    group_main,
    kill_group,
    replace_and_finish,
    stop_all,
    wait_for_a_step_together,
    wait_for_step,
)
from raytrain.testing.runs import run_single
from raytrain.testing.s3_server import make_bucket, s3_server
from tests.support.corpus import CHATML, chat_inputs
from tests.support.tolerances import SUM_ORDER

STEPS = 40


@pytest.mark.timeout(240)
def test_groups_losing_one_train_on_a_buckets_shards_as_one_process(tmp_path: Path) -> None:
    from torchft.coordination import LighthouseServer

    os.environ.setdefault("RUST_LOG", "error")
    with s3_server() as endpoint:
        make_bucket(endpoint, "corpora")
        tokenizer, files = chat_inputs(tmp_path, CHATML)
        prefix = "s3://corpora/chats"
        prepare(files, str(tokenizer), prefix, shard_tokens=500, chat=True)
        job = {"name": "bucket-groups",
               "model": {"gpt": {"vocab_size": 320, "dim": 32, "num_layers": 2,
                                 "num_heads": 4, "max_seq_len": 16}},
               "data": {"kind": "token_file", "path": prefix, "seq_len": 16, "shuffle": True},
               "training": {"steps": STEPS, "global_batch_size": 12, "micro_batch_size": 2,
                            "checkpoint_every_steps": 1000, "learning_rate": 0.01},
               "resources": {"num_workers": 1}}
        expected = run_single(JobSpec.model_validate(job), tmp_path / "reference").losses()
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200,
                                      heartbeat_timeout_ms=1500)
        context = multiprocessing.get_context("spawn")
        processes = {group: context.Process(
            target=partial(group_main, job=job, groups=2),
            args=(group, lighthouse.address(), str(tmp_path)), daemon=True) for group in (0, 1)}
        for process in processes.values():
            process.start()
        try:
            (tmp_path / "slow").touch()
            (tmp_path / "start-0").touch()
            (tmp_path / "start-1").touch()
            together = wait_for_a_step_together(tmp_path, (0, 1))
            wait_for_step(tmp_path, together + 4)
            kill_group(tmp_path, processes[1], 1)
            replace_and_finish(tmp_path, processes, context.Process(
                target=partial(group_main, job=job, groups=2, heals=True),
                args=(1, lighthouse.address(), str(tmp_path)), daemon=True))
        finally:
            stop_all(processes, lighthouse)
    assert processes[0].exitcode == 0 and processes[2].exitcode == 0
    losses = all_losses(tmp_path)
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in losses.items():
        assert loss == pytest.approx(expected[step], abs=SUM_ORDER), step
