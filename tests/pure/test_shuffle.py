"""data.shuffle: each epoch a seeded permutation of a token file's windows, computed per
index, so the order is the same on any rank count and across resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain.core.shuffle import shuffled, windows
from raytrain.spec import JobSpec
from raytrain.testing.runs import run_single
from tests.support.tolerances import SAME_ORDER


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**31), st.integers(0, 1000))
def test_each_epoch_reads_every_window_once(n: int, seed: int, epoch: int) -> None:
    order = shuffled(np.arange(n), n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))


def test_epochs_and_seeds_give_different_orders_and_indices_their_epochs() -> None:
    n = 1000
    first, second = shuffled(np.arange(n), n, 0, 0), shuffled(np.arange(n), n, 0, 1)
    other_seed = shuffled(np.arange(n), n, 1, 0)
    assert (first != second).mean() > 0.9 and (first != other_seed).mean() > 0.9
    assert (first != np.arange(n)).mean() > 0.9
    picked = windows(range(2 * n), n, True, 0)
    assert np.array_equal(picked[:n], first) and np.array_equal(picked[n:], second)
    assert np.array_equal(windows(range(2 * n), n, False, 0), np.arange(2 * n) % n)


def job(path: Path, shuffle: bool) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 16}},
        "data": {"kind": "token_file", "path": str(path), "seq_len": 16, "shuffle": shuffle},
        "training": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 4,
                     "checkpoint_every_steps": 5, "learning_rate": 0.01},
        "resources": {"num_workers": 1}})


def test_a_shuffled_job_resumes_on_the_same_order(tmp_path: Path) -> None:
    """Stopped at step 5 and resumed, a shuffled job's losses are an uninterrupted one's;
    and they differ from the file-order job's (the order took effect)."""
    tokens = np.random.default_rng(0).integers(0, 64, size=16 * 40 + 1).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    whole = run_single(job(path, True), tmp_path / "whole").losses()
    run_single(job(path, True), tmp_path / "cut", stop_after_steps=5)
    resumed = run_single(job(path, True), tmp_path / "cut").losses()
    for step in range(6, 11):
        assert resumed[step] == pytest.approx(whole[step], abs=SAME_ORDER), step
    in_order = run_single(job(path, False), tmp_path / "ordered").losses()
    assert any(abs(in_order[s] - whole[s]) > 1e-3 for s in whole)


def test_shuffle_is_refused_where_there_is_no_file_order() -> None:
    with pytest.raises(Exception, match="shuffle"):
        JobSpec.model_validate({"data": {"kind": "synthetic", "shuffle": True}})
