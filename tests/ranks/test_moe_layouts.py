"""A mixture of experts on 2 gloo ranks (pretrained Qwen3-MoE and DeepSeek-V3 folders made with
transformers):
data parallel, fully sharded and expert parallel (`strategy: expert`, ep 2: the experts split
over the ranks, tokens exchanged by all-to-all) take the same steps, with the family's
balancing loss in the objective (each rank balances its own micro-batches, alike in the three);
with balancing off, expert parallelism is one process's steps; a run cut under ep 2 resumes
under FSDP on the same losses (the checkpoint's experts resharded); each rank holds half the
experts' bytes; and the folder exported from ep 2 loads in transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raytrain.models.hf import load_pretrained
from raytrain.models.registry import build_model
from raytrain.spec import JobSpec
from raytrain.testing.parity import _losses, _spawn
from raytrain.testing.runs import run_single
from tests.support.hf_models import hf_job, hf_logits, make_folder
from tests.support.tolerances import LOGITS, SUM_ORDER

pytest.importorskip("transformers")

STEPS = 4
NO_BALANCE = {"moe": {"aux_loss_coef": 0.0}}


def _job(folder: Path, parallel: dict[str, object], **training: object) -> dict[str, object]:
    document = hf_job(folder, steps=STEPS, parallel=parallel, resources={"num_workers": 2})
    document["training"] = {**document["training"], "checkpoint_every_steps": 2, **training}
    return document


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("moe_layouts")
    folder = make_folder("qwen3_moe", root / "qwen3_moe")
    cases = [
        ("dp2", _job(folder, {"strategy": "data"}), {}),
        ("fsdp2", _job(folder, {"strategy": "fsdp"}), {}),
        ("ep2", _job(folder, {"strategy": "expert"}), {}),
        ("ep2_unbalanced", _job(folder, {"strategy": "expert"}, **NO_BALANCE), {}),
        ("resume_fsdp2", _job(folder, {"strategy": "fsdp"}),
         {"resume_from": str(root / "runs" / "ep2" / "step_000000002")}),
    ]
    # DeepSeek-V3 (latent attention, sigmoid group-limited routing, the correction bias). Its
    # bias held (rate 0): moving it drives experts' loads to the margin where a token's
    # choice is a near tie, which the layouts' last-bit differences then decide apart (the
    # losses 2.5e-5 apart after a step, measured); the update is tests/pure/test_moe.py's.
    v3 = make_folder("deepseek_v3", root / "deepseek_v3")
    held = {"moe": {"bias_update_rate": 0.0}}
    cases += [(f"v3_{name}", _job(v3, parallel, **held), {}) for name, parallel in (
        ("dp2", {"strategy": "data", "elastic": False}), ("fsdp2", {"strategy": "fsdp"}),
        ("ep2", {"strategy": "expert"}))]
    _spawn(2, cases, root / "runs")
    return root, folder


def test_data_fsdp_and_expert_parallel_take_the_same_steps(runs: tuple[Path, Path]) -> None:
    root, _ = runs
    dp2, fsdp2, ep2 = (_losses(root / "runs" / name / "losses.json")
                       for name in ("dp2", "fsdp2", "ep2"))
    assert sorted(ep2) == list(range(1, STEPS + 1))
    for step in ep2:
        assert ep2[step] == pytest.approx(dp2[step], abs=SUM_ORDER), step
        assert fsdp2[step] == pytest.approx(dp2[step], abs=SUM_ORDER), step
    v3 = {name: _losses(root / "runs" / f"v3_{name}" / "losses.json")
          for name in ("dp2", "fsdp2", "ep2")}
    for step in v3["ep2"]:
        assert v3["ep2"][step] == pytest.approx(v3["dp2"][step], abs=SUM_ORDER), step
        assert v3["fsdp2"][step] == pytest.approx(v3["dp2"][step], abs=SUM_ORDER), step
    resumed = _losses(root / "runs" / "resume_fsdp2" / "losses.json")
    assert sorted(resumed) == [3, 4]
    for step in resumed:
        assert resumed[step] == pytest.approx(ep2[step], abs=SUM_ORDER), step


def test_expert_parallel_without_balancing_is_one_process(runs: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    root, folder = runs
    single = JobSpec.model_validate(
        {**hf_job(folder, steps=STEPS), "training": {
            **hf_job(folder, steps=STEPS)["training"], **NO_BALANCE}})
    expected = run_single(single, tmp_path / "single").losses()
    losses = _losses(root / "runs" / "ep2_unbalanced" / "losses.json")
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, abs=SUM_ORDER), step


def test_the_folder_exported_from_expert_parallel_loads_in_transformers(
        runs: tuple[Path, Path]) -> None:
    root, _ = runs
    fsdp = build_model(JobSpec.model_validate(hf_job(root / "runs" / "fsdp2" / "hf")).model)
    load_pretrained([fsdp], str(root / "runs" / "fsdp2" / "hf"), False)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = fsdp.eval()(tokens)
    assert torch.allclose(hf_logits(root / "runs" / "ep2" / "hf", tokens), ours,
                          atol=LOGITS, rtol=0)


def test_under_ep_2_each_rank_holds_half_the_experts(runs: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    """Measured on the ranks, after a step: the bytes of the experts' weights each holds,
    against one process's (every expert of each sparse block)."""
    import torch.multiprocessing as mp

    from raytrain.testing.parity import _free_port, held_expert_bytes

    _, folder = runs
    whole = sum(p.nbytes for name, p in build_model(JobSpec.model_validate(
        hf_job(folder)).model).named_parameters() if ".experts." in name)
    mp.spawn(held_expert_bytes, args=(2, _free_port(), _job(folder, {"strategy": "expert"}),
                                      str(tmp_path)), nprocs=2)
    held = [int((tmp_path / f"experts-{rank}.txt").read_text()) for rank in range(2)]
    assert held == [whole // 2, whole // 2], (held, whole)
    # The all-to-all bytes a rank sent, against the planner's count for the same shapes
    # (balanced routing: each token's top-k hidden states, the other rank's share of them,
    # dispatched and combined in each sparse block).
    from raytrain.core.resolve import planner_inputs

    spec = JobSpec.model_validate(_job(folder, {"strategy": "expert"}))
    dims = planner_inputs(spec)[0]
    predicted = 2 * dims.sparse_layers * dims.all_to_all_bytes(2 * 16, 4, 2)
    sent = [int((tmp_path / f"all-to-all-{rank}.txt").read_text()) for rank in range(2)]
    print(f"all-to-all bytes a rank sent: {sent}, the planner's {predicted:.0f}")
    assert all(0.5 * predicted <= s <= 1.5 * predicted for s in sent), (sent, predicted)


def test_experts_over_two_of_four_fully_sharded_ranks_take_fsdps_steps(
        runs: tuple[Path, Path], tmp_path: Path) -> None:
    """ep 2 within dp_shard 4: two expert groups, each expert's gradient summed over them."""
    _, folder = runs
    four = {"num_workers": 4}
    cases = [(name, {**_job(folder, parallel), "resources": four}, {})
             for name, parallel in (("fsdp4", {"strategy": "fsdp"}),
                                    ("ep2_fsdp4", {"strategy": "fsdp", "ep": 2}))]
    _spawn(4, cases, tmp_path)
    fsdp4, ep2 = (_losses(tmp_path / name / "losses.json") for name in ("fsdp4", "ep2_fsdp4"))
    assert sorted(ep2) == list(range(1, STEPS + 1))
    for step in ep2:
        assert ep2[step] == pytest.approx(fsdp4[step], abs=SUM_ORDER), step
