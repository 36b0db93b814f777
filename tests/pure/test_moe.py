"""Mixtures of experts from Hugging Face folders (tiny models made with transformers and
`save_pretrained`, one process): each family's logits equal transformers' forward, from the
hub's layout (one tensor per expert) and from the packed one transformers keeps in memory;
an export loads back with `from_pretrained` to the same logits; what is not in the built-in
blocks is refused naming the field."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from raytrain.errors import SpecError
from raytrain.models.hf import export_folder, load_pretrained
from raytrain.models.moe import MoE, balancing
from raytrain.models.registry import build_model
from raytrain.spec import JobSpec
from tests.support.hf_models import MOE_FAMILIES, hf_job, hf_logits, make_folder
from tests.support.tolerances import LOGITS

pytest.importorskip("transformers")


def _ours(folder: Path) -> torch.nn.Module:
    spec = JobSpec.model_validate(hf_job(folder))
    model = build_model(spec.model, seed=0)
    load_pretrained([model], str(folder), spec.model.gpt.tie_embeddings)
    return model.eval()


def _packed(folder: Path, out: Path) -> Path:
    """The folder's model as transformers holds it in memory (experts packed), written with
    safetensors beside the same config."""
    import transformers
    from safetensors.torch import save_file

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))
    shutil.copy(folder / "config.json", out / "config.json")
    return out


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_each_moe_familys_logits_equal_transformers_from_either_layout(
        family: str, tmp_path: Path) -> None:
    """Routing, the top-k's normalisation, the shared expert's gate and the dense blocks are
    all in play (the routers' weights are drawn wide, so routing is far from uniform);
    leaving out Qwen2-MoE's shared gate or Qwen3-MoE's normalisation fails it (each undone
    once)."""
    folder = make_folder(family, tmp_path / family)
    tokens = torch.randint(64, (2, 24), generator=torch.Generator().manual_seed(1))
    theirs = hf_logits(folder, tokens)
    model = _ours(folder)
    with torch.no_grad():
        ours = model(tokens)
        packed = _ours(_packed(folder, tmp_path / "packed"))(tokens)
    assert torch.allclose(ours, theirs, atol=LOGITS, rtol=0), (ours - theirs).abs().max()
    assert torch.equal(ours, packed)
    config = json.loads((folder / "config.json").read_text())
    sparse = [m for m in model.modules() if isinstance(m, MoE)]
    expected = {"qwen3_moe": 1, "qwen2_moe": 1, "mixtral": 2, "deepseek_v3": 2,
                "deepseek_v2": 2}[family]  # the dense blocks'
    assert len(sparse) == expected, config


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_an_moe_export_is_the_hubs_layout_and_loads_to_the_same_logits(
        family: str, tmp_path: Path) -> None:
    from safetensors import safe_open

    folder = make_folder(family, tmp_path / family)
    model = _ours(folder)
    out = export_folder([model], str(folder), tmp_path / "out", tied=False)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = model(tokens)
    assert torch.allclose(hf_logits(out, tokens), ours, atol=LOGITS, rtol=0)
    written = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"])
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        assert written == set(handle.keys())  # the hub's names, one tensor per expert


def test_the_balancing_loss_is_transformers_and_imbalance_is_the_busiest_over_the_mean(
        tmp_path: Path) -> None:
    """`balancing` over a forward's blocks equals transformers' load_balancing_loss_func of
    the same router logits; the imbalance is at least 1 and at most experts / top_k."""
    import transformers
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    folder = make_folder("mixtral", tmp_path / "mixtral")
    tokens = torch.randint(64, (2, 24), generator=torch.Generator().manual_seed(3))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = theirs(tokens, output_router_logits=True)
    expected = load_balancing_loss_func(out.router_logits, 4, 2)
    model = _ours(folder)
    model(tokens)
    loss, imbalance = balancing([m for m in model.modules() if isinstance(m, MoE)])
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)
    assert 1.0 <= float(imbalance) <= 2.0


@pytest.mark.parametrize(("architecture", "extra", "field"), [
    ("GptOssForCausalLM", {}, "architectures"),
    ("DeepseekV3ForCausalLM", {"scoring_func": "softmax"}, "scoring_func"),
    ("DeepseekV2ForCausalLM", {"topk_method": "noaux_tc"}, "topk_method"),
    ("MixtralForCausalLM", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
])
def test_what_the_experts_blocks_do_not_implement_is_refused_naming_the_field(
        architecture: str, extra: dict[str, object], field: str, tmp_path: Path) -> None:
    folder = make_folder("mixtral", tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {**config, "architectures": [architecture], **extra}))
    with pytest.raises(SpecError) as refused:
        JobSpec.model_validate(hf_job(folder))
    assert field in str(refused.value) and "To fix" in str(refused.value)


def test_deepseek_v3s_bias_moves_towards_balance_and_a_dense_model_is_left_alone(
        tmp_path: Path) -> None:
    """training.moe.bias_update_rate: after a step every expert's score correction bias has
    moved by the rate, up for those that got fewer tokens than the mean and down for those
    that got more (centred); at 0 it stays as loaded, as transformers leaves it (the parity
    of steps in tests/pure/test_step_math.py runs with 0)."""
    from raytrain.core.resolve import job_layout
    from raytrain.testing.jobs import RecordingSink
    from raytrain.train.loop import train
    from raytrain.train.rank import WorkerInfo

    folder = make_folder("deepseek_v3", tmp_path / "v3")
    loaded = [m.score_bias.clone() for m in _ours(folder).modules() if isinstance(m, MoE)]
    for rate in (0.0, 0.01):
        document = hf_job(folder, steps=1)
        document["training"] = {**document["training"], "moe": {"bias_update_rate": rate}}
        spec = JobSpec.model_validate(document)
        sink = RecordingSink()
        train(spec, WorkerInfo.single_process(), sink, tmp_path / f"run-{rate}",
              layout=job_layout(spec), progress_interval_s=0.0)
        trained = _ours(tmp_path / f"run-{rate}" / "hf")
        moved = [m.score_bias - before for m, before in zip(
            (m for m in trained.modules() if isinstance(m, MoE)), loaded)]
        if rate == 0:
            assert all(torch.equal(d, torch.zeros_like(d)) for d in moved)
            continue
        for change in moved:
            assert change.abs().max() <= 2 * rate and change.abs().max() > 0
            assert float(change.sum()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: "
                    "scripts/gpu_check.sh runs it")
def test_the_grouped_gemm_equals_the_loop_of_experts_on_a_gpu() -> None:
    """On CUDA the experts run as one grouped GEMM (torch._grouped_mm); its outputs and
    gradients equal the loop of one matmul per expert the CPU runs, in bf16 at bf16's
    precision (every shape a multiple of 16 bytes, as the grouped GEMM needs)."""
    from raytrain.models.moe import Experts

    torch.manual_seed(0)
    experts = Experts(8, 64, 128).cuda().bfloat16()
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.05)
    counts = [5, 0, 17, 3, 9, 0, 21, 9]
    x = torch.randn(sum(counts), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grouped = experts(x, counts)
    grouped.float().pow(2).sum().backward()
    on_cpu = copy.deepcopy(experts).cpu()  # the CPU's path (a loop), on the same weights
    x_cpu = x.detach().cpu().requires_grad_()
    looped = on_cpu(x_cpu, counts)
    assert torch.allclose(grouped.float().cpu(), looped.float(), atol=2e-2, rtol=2e-2)
    looped.float().pow(2).sum().backward()
    assert torch.allclose(x.grad.float().cpu(), x_cpu.grad.float(), atol=5e-2, rtol=5e-2)
