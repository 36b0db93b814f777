"""A model's shape from its Hugging Face config.json (raytrain.spec.hf_config), and
`raytrain plan --model-config`: the shape is the one the config describes, and what cannot
be read is an error naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raytrain.core.resolve import planner_inputs
from raytrain.errors import SpecError
from raytrain.spec import JobSpec
from raytrain.spec.hf_config import gpt_config_from_hf

ROOT = Path(__file__).resolve().parents[2]
LLAMA_3_8B = json.loads((ROOT / "raytrain" / "examples" / "llama-3-8b-config.json").read_text())
GPT2 = {"activation_function": "gelu_new", "attn_pdrop": 0.1, "bos_token_id": 50256,
        "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
        "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_type": "cls_index", "vocab_size": 50257}


def test_llama_and_gpt2_configs_read_as_their_shapes() -> None:
    llama = gpt_config_from_hf(LLAMA_3_8B, "config.json")
    assert (llama.dim, llama.num_layers, llama.num_heads, llama.num_kv_heads, llama.ffn_dim,
            llama.vocab_size, llama.max_seq_len) == (4096, 32, 32, 8, 14336, 128256, 8192)
    assert (llama.mlp, llama.positions, llama.tie_embeddings, llama.rope_theta) == \
        ("swiglu", "rotary", False, 500000.0)
    gpt2 = gpt_config_from_hf(GPT2, "config.json")
    assert (gpt2.dim, gpt2.num_layers, gpt2.hidden_dim, gpt2.mlp, gpt2.positions,
            gpt2.tie_embeddings) == (768, 12, 3072, "gelu", "learned", True)
    # The planner counts them as published: Llama 3 8B is 8.03B parameters, GPT-2 124M.
    for config, params in ((llama, 8.03e9), (gpt2, 124.4e6)):
        spec = JobSpec.model_validate({"model": {"gpt": config.model_dump()},
                                       "data": {"seq_len": 1024}})
        dims = planner_inputs(spec)[0]
        assert dims.params == pytest.approx(params, rel=0.005)


def test_qwen3s_own_head_width_and_qk_norms_are_counted_as_transformers_builds_them() -> None:
    """Qwen3-0.6B's shape (16 heads of 128 over hidden_size 1,024, q/k norms, tied
    embeddings): the planner's parameter count is the parameters transformers makes of that
    config (596,049,920: Qwen's "0.6B"), and the built-in model's."""
    import torch
    import transformers

    from raytrain.models.gpt import GPT
    from raytrain.spec.hf_model import HFSource, derived_gpt

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
              "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu",
              "attention_bias": False, "use_sliding_window": False, "sliding_window": None}
    with torch.device("meta"):
        theirs = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))
    counted = sum(p.numel() for p in theirs.parameters())
    with tempfile.TemporaryDirectory() as tmp:  # the folder a kind 'hf' job names
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        gpt = derived_gpt(HFSource(path=tmp, weights="random"))
    assert (gpt.head_dim, gpt.qk_norm, gpt.tie_embeddings) == (128, True, True)
    with torch.device("meta"):
        ours = sum(p.numel() for p in GPT(gpt).parameters())
    spec = JobSpec.model_validate({"model": {"gpt": gpt.model_dump()}, "data": {"seq_len": 1024}})
    assert planner_inputs(spec)[0].params == ours == counted == 596_049_920


@pytest.mark.parametrize(("change", "field", "says"), [
    ({"hidden_size": None}, "hidden_size", "missing"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128}, "qk_nope_head_dim",
     "latent attention"),
    ({"hidden_act": "relu"}, "hidden_act", "To fix"),
    ({"cross_layer_sharing": True}, "cross_layer_sharing", "not a field the planner knows"),
    ({"num_key_value_heads": 5}, "num_key_value_heads", "must divide num_heads"),
])
def test_what_cannot_be_read_names_the_field(change: dict, field: str, says: str) -> None:
    config = {**LLAMA_3_8B, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(SpecError) as raised:
        gpt_config_from_hf(config, "config.json")
    assert [e.loc for e in raised.value.errors] == [(field,)]
    assert says in raised.value.errors[0].msg


def test_raytrain_plan_model_config_plans_a_70b_llama_on_64_h100s(tmp_path: Path) -> None:
    """`raytrain plan --model-config` (a subprocess, as a user runs it) with no spec file;
    and a wrong field stops it with the field's name and exit 2."""
    config = {**LLAMA_3_8B, "hidden_size": 8192, "intermediate_size": 28672,
              "num_attention_heads": 64, "num_hidden_layers": 80}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    began = time.monotonic()
    planned = subprocess.run([sys.executable, "-m", "raytrain.cli", "plan", "--model-config",
                              str(path), "--gpus", "64", "--gpu", "h100-sxm", "--json"],
                             capture_output=True, text=True, timeout=120)
    print(f"plan --model-config, 70B on 64 H100s: {time.monotonic() - began:.2f} s")
    assert planned.returncode == 0, planned.stderr
    plans = json.loads(planned.stdout)["plans"]
    assert plans and plans[0]["fits"] and "tp" in plans[0]["layout"]
    path.write_text(json.dumps({**config, "activation_function": "relu", "hidden_act": "relu"}))
    refused = subprocess.run([sys.executable, "-m", "raytrain.cli", "plan", "--model-config",
                              str(path), "--gpus", "64", "--gpu", "h100-sxm"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "hidden_act" in refused.stderr, refused.stderr


def test_a_users_own_model_with_a_shape_is_planned_data_parallel_by_memory() -> None:
    """An imported model whose shape is stated: strategy 'auto' picks FSDP when a whole
    replica does not fit a device (Llama 3 8B on 16 RTX 4090s, recomputing: 16 bytes a
    parameter is far over 24 GB) and never tensor or pipeline parallelism, which cut the
    built-in GPT by name (the test fails without that restriction). Without the shape the
    job stays plain data parallel, as before."""
    from raytrain.core.resolve import job_layout

    shape = gpt_config_from_hf(LLAMA_3_8B, "config.json").model_dump()
    document = {"model": {"kind": "import", "factory": "raytrain.testing.jobs:make_tiny_model",
                          "shape": shape},
                "data": {"seq_len": 2048},
                "training": {"global_batch_size": 64, "micro_batch_size": 1,
                             "precision": "bf16"},
                "parallel": {"strategy": "auto", "recompute": "full"},
                "resources": {"num_workers": 16, "gpus_per_worker": 1,
                              "accelerator": "rtx4090"}}
    layout = job_layout(JobSpec.model_validate(document))
    assert layout.dp_shard > 1 and (layout.tp, layout.pp) == (1, 1), layout.describe()
    unknown = {**document, "model": {k: v for k, v in document["model"].items()
                                     if k != "shape"}}
    assert job_layout(JobSpec.model_validate(unknown)).dp_replicate == 16
    with pytest.raises(Exception, match="shape means nothing"):
        JobSpec.model_validate({"model": {"gpt": {}, "shape": shape}})


def test_a_mixture_of_experts_is_priced_by_its_active_parameters_and_held_by_all() -> None:
    """Qwen3-30B-A3B's config (tests/data, as the hub ships it): 30.5B parameters, 3.3B
    active, as Qwen publishes them; its FLOPs a token follow the active ones (twice the
    experts at the same top-k: the same FLOPs but the router's, about twice the expert
    parameters; counting the FLOPs from every parameter fails it: undone once), and a
    dense model's active parameters are all of them."""
    from raytrain.core.dims import ModelDims

    config = json.loads((ROOT / "tests" / "data" / "qwen3-30b-a3b-config.json").read_text())

    def dims_of(document: dict[str, object]) -> ModelDims:
        g = gpt_config_from_hf(document, "config.json")
        return ModelDims.from_gpt(g.num_layers, g.dim, g.num_heads, g.hidden_dim, g.vocab_size,
                                  4096, g.max_seq_len, g.num_kv_heads, True, True,
                                  g.tie_embeddings, g.head_dim, g.qk_norm, g.moe)

    dims = dims_of(config)
    assert dims.params == pytest.approx(30.5e9, rel=0.01)
    assert dims.active_params == pytest.approx(3.3e9, rel=0.02)
    attention = 12.0 * dims.num_layers * dims.q_dim * dims.seq_len
    lookups = dims.embedding_params  # the embeddings are looked up, not multiplied
    assert dims.flops_per_token == pytest.approx(6 * (dims.active_params - lookups) + attention,
                                                 rel=1e-6)
    doubled = dims_of({**config, "num_experts": 256})
    # only the router grows (dim x experts a block): 0.3% more FLOPs
    assert doubled.flops_per_token == pytest.approx(dims.flops_per_token, rel=5e-3)
    assert doubled.params > 1.9 * dims.params - dims.active_params
    dense = dims_of(LLAMA_3_8B)
    assert dense.active_params == dense.params


def test_the_planner_chooses_expert_parallelism_by_the_links_it_would_cross() -> None:
    """Qwen3-30B-A3B fully fine-tuned on 16 H100s (two nodes of 8): FSDP alone all-gathers all
    30.5B parameters for a 3.3B-active step, and expert parallelism beats it; over the
    nodes' network (50 GB/s a GPU against NVLink's 450) its all-to-alls stay within a node
    (ep 8), and with a network as fast as NVLink they span both (ep 16)."""
    from dataclasses import replace

    from raytrain.catalog.hardware import node_shape
    from raytrain.core.dims import ModelDims, Workload
    from raytrain.core.planner import plan

    config = json.loads((ROOT / "tests" / "data" / "qwen3-30b-a3b-config.json").read_text())
    g = gpt_config_from_hf(config, "config.json")
    dims = ModelDims.from_gpt(g.num_layers, g.dim, g.num_heads, g.hidden_dim, g.vocab_size,
                              4096, g.max_seq_len, g.num_kv_heads, True, True, False,
                              g.head_dim, g.qk_norm, g.moe)
    work = Workload(global_batch=64, data_parallel_only=True)
    shape = node_shape("h100-sxm")
    plans = plan(dims, work, "h100-sxm", 16, shape=shape, keep=200)
    best, fsdp = plans[0], min((p for p in plans if p.candidate.ep == 1),
                               key=lambda p: p.step_s)
    assert best.candidate.ep == 8 and best.step_s < 0.7 * fsdp.step_s
    fast = replace(shape, inter=replace(shape.inter, bandwidth=shape.intra.bandwidth,
                                        latency_s=shape.intra.latency_s))
    assert plan(dims, work, "h100-sxm", 16, shape=fast)[0].candidate.ep == 16


def test_deepseeks_parameters_are_counted_as_published() -> None:
    """DeepSeek-V3's and V2-Lite's configs as the hub ships them (benchmarks/configs): 671B
    parameters with 37B active, and 15.7B; latent attention counted by its own projections
    (counting it as multi-head attention of its query width gives 703B: undone once)."""
    from raytrain.core.resolve import planner_inputs
    from raytrain.spec import JobSpec

    counts = {}
    for name in ("deepseek-v3", "deepseek-v2-lite"):
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "config.json").write_text(
                (ROOT / "benchmarks" / "configs" / f"{name}.json").read_text())
            spec = JobSpec.model_validate({
                "model": {"kind": "hf", "hf": {"path": folder, "weights": "random"}},
                "data": {"seq_len": 4096}, "parallel": {"strategy": "fsdp"},
                "training": {"global_batch_size": 64, "micro_batch_size": 1},
                "resources": {"num_workers": 8}})
            dims = planner_inputs(spec)[0]
        counts[name] = (dims.params, dims.active_params)
    assert counts["deepseek-v3"][0] == pytest.approx(671e9, rel=0.005)
    assert counts["deepseek-v3"][1] == pytest.approx(37e9, rel=0.03)
    assert counts["deepseek-v2-lite"][0] == pytest.approx(15.7e9, rel=0.01)
