"""LoRA (training.lora): low-rank adapters on a pretrained Hugging Face folder with every
other weight frozen. A job trains only the adapters, ends with them as a PEFT folder that
`peft` loads onto the source model with raytrain's logits, and exports the merged model that
`transformers` loads with the same logits; what it does not combine with is refused naming
training.lora; and the planner counts no gradients or optimizer state for frozen weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from raytrain.core.resolve import job_layout, planner_inputs
from raytrain.spec import JobSpec
from raytrain.testing.jobs import RecordingSink
from raytrain.train.checkpoint import CheckpointManager
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo
from tests.support.hf_models import hf_job, hf_logits, make_folder
from tests.support.tolerances import LOGITS

pytest.importorskip("peft")
LORA = {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "down_proj"]}


def lora_job(folder: Path, steps: int = 6, lora: dict | None = None, **sections: object
             ) -> dict:
    document = hf_job(folder, steps=steps, **sections)
    document["training"] = {**document["training"], "lora": lora or LORA,
                            "learning_rate": 0.05}
    return document


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_only_the_adapters_train_and_peft_loads_them_with_raytrains_logits(
        tmp_path: Path, family: str) -> None:
    """A mixture of experts (Qwen3-MoE): adapters on the attention, the experts frozen."""
    import peft
    import transformers

    from raytrain.models.lora import apply_lora
    from raytrain.models.registry import build_model
    from raytrain.train.export import export_checkpoint

    folder = make_folder(family, tmp_path / family)
    attention_only = {**LORA, "targets": ["q_proj", "v_proj"]}
    spec = JobSpec.model_validate(lora_job(folder, lora=attention_only if "moe" in family
                                           else None))
    sink = RecordingSink()
    train(spec, WorkerInfo.single_process(), sink, tmp_path / "ckpt", layout=job_layout(spec),
          progress_interval_s=0.0)
    losses = sink.losses()
    assert losses[6] < losses[1]  # it learned
    model = build_model(spec.model, seed=0)
    apply_lora(model, spec.training.lora)
    latest = CheckpointManager(tmp_path / "ckpt", 0).latest()
    assert latest is not None
    CheckpointManager(tmp_path / "ckpt", 0).load(
        latest, [model], [torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])])
    base = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    pretrained = dict(base.named_parameters())
    from raytrain.models.hf import to_hf

    for name, param in model.named_parameters():  # the base weights did not move
        if ".lora_" not in name and ".experts." not in name:  # (experts: packed there)
            assert torch.equal(param, pretrained[to_hf(name)]), name
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.eval()(tokens)
    assert not torch.allclose(ours, hf_logits(folder, tokens), atol=1e-3)  # adapted
    adapter = tmp_path / "ckpt" / "hf"  # the job's end: the adapter as a PEFT folder
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(tokens).logits, ours, atol=LOGITS, rtol=0)
    merged = export_checkpoint(spec, str(latest), tmp_path / "merged", merge=True)
    assert not (merged / "adapter_config.json").exists()
    assert torch.allclose(hf_logits(merged, tokens), ours, atol=LOGITS, rtol=0)


@pytest.mark.parametrize(("sections", "says"), [
    ({"parallel": {"strategy": "tensor"}, "resources": {"num_workers": 2}}, "'data' or 'fsdp'"),
    ({"training": {"precision": "fp8"}}, "bf16"),
])
def test_what_lora_does_not_combine_with_is_refused_naming_it(
        tmp_path: Path, sections: dict, says: str) -> None:
    document = lora_job(make_folder("llama", tmp_path / "llama"))
    for key, value in sections.items():
        document[key] = {**document.get(key, {}), **value}
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(document)
    assert ("training", "lora") in [e["loc"] for e in refused.value.errors()]
    assert says in str(refused.value)


def test_the_planner_keeps_no_gradients_or_optimizer_state_for_frozen_weights() -> None:
    """Llama 3 8B's shape at sequence 2,048: fully fine-tuned it needs more than one 24 GB
    RTX 4090 can hold; with rank-16 adapters on the attention, one holds it."""
    from raytrain.core.planner import NothingFits, plan

    root = Path(__file__).resolve().parents[2]
    from raytrain.spec.hf_config import gpt_config_from_hf

    gpt = gpt_config_from_hf(json.loads(
        (root / "raytrain" / "examples" / "llama-3-8b-config.json").read_text()), "llama")
    document = {"model": {"gpt": gpt.model_dump()}, "data": {"seq_len": 2048},
                "training": {"global_batch_size": 8, "micro_batch_size": 1,
                             "precision": "bf16"},
                "parallel": {"recompute": "full"},
                "resources": {"num_workers": 1, "gpus_per_worker": 1, "accelerator": "rtx4090"}}
    full = JobSpec.model_validate(document)
    lora = JobSpec.model_validate({**document, "training": {
        **document["training"], "lora": {"rank": 16, "targets": ["q_proj", "k_proj",
                                                                  "v_proj", "o_proj"]}}})
    dims, work, kind, gpus = planner_inputs(full)
    with pytest.raises(NothingFits):
        plan(dims, work, kind, gpus=gpus)
    dims, work, kind, gpus = planner_inputs(lora)
    assert 0 < work.trainable_share < 0.01
    [best, *_] = plan(dims, work, kind, gpus=gpus)
    print(f"\nLlama 3 8B, LoRA rank 16 on q/k/v/o, seq 2,048, 1 x RTX 4090: "
          f"{best.memory_bytes / 2**30:.1f} GiB of 24, {best.tokens_per_s:,.0f} tokens/s")
    assert best.fits
    # The frozen weights' backward computes their inputs' gradients only: two of each
    # linear's three matmuls, so a LoRA step on the same layout is about a third shorter
    # than full training's in its matmuls (attention and elementwise work unchanged).
    from raytrain.core.planner import evaluate, node_shape

    full_dims, full_work, _, _ = planner_inputs(full)
    shape = node_shape(kind)
    ratio = evaluate(dims, work, best.candidate, shape).step_s / \
        evaluate(full_dims, full_work, best.candidate, shape).step_s
    assert 0.6 < ratio < 0.8, ratio


def test_a_lora_replica_group_heals_from_a_trained_one(tmp_path: Path) -> None:
    """What a replica group joining a LoRA job under `data` does: load a live group's state
    (weights, AdamW moments, step) into its own. Adapters are all matrices, so the optimizer's
    group for norms and biases has no parameters; torch's set_state_dict read a saved group's
    first parameter and failed (IndexError) while the second group joined, which then never
    trained (it fails without the empty group left out of build_optimizer)."""
    from raytrain.train.checkpoint import _state
    from raytrain.train.rank import build_rank
    from raytrain.train.replica_group import _load_local, _local

    spec = JobSpec.model_validate(lora_job(make_folder("llama", tmp_path / "llama")))
    live, joining = (build_rank(spec, job_layout(spec), WorkerInfo.single_process())[:2]
                     for _ in range(2))
    (model, optimizers), (new_model, new_optimizers) = live, joining
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.randn_like(param)
    for optimizer in optimizers:
        optimizer.step()
    model_state, optim_state, _ = _state(model.parts, optimizers)
    _load_local(new_model.parts, new_optimizers,
                {"model": _local(model_state), "optim": _local(optim_state)})
    healed_model, healed_optim, _ = _state(new_model.parts, new_optimizers)
    assert healed_model.keys() == model_state.keys() and healed_optim.keys() == optim_state.keys()
    for theirs, mine in ((model_state, healed_model), (optim_state, healed_optim)):
        for key, value in theirs.items():
            assert torch.equal(mine[key], value) if isinstance(value, torch.Tensor) \
                else mine[key] == value, key
    assert any(".lora_" in key for key in optim_state)
    # A state the group cannot load fails loudly, naming the group (its runner then fails
    # the run: elastic_launcher), where the group was started again and again unseen.
    from types import SimpleNamespace

    from raytrain.train.replica_group import HEAL_FAILED, HealFailed, healer

    load = healer(1, new_model, new_optimizers, SimpleNamespace(first_loss=None))
    with pytest.raises(HealFailed, match=f"replica group 1 {HEAL_FAILED}.*KeyError"):
        load({"model": {}, "optim": _local(optim_state)})
    load({"model": _local(model_state), "optim": _local(optim_state), "first_loss": 4.0})
