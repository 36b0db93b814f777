"""Tiny Hugging Face models of each supported family, made with transformers and written with
`save_pretrained` (nothing from a hub), and a job spec that trains one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHAPE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "llama3_tied": ("LlamaConfig", "LlamaForCausalLM", {
        "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    # transformers' own default window (4,096), past the model's 64 positions: full attention
    "mistral": ("MistralConfig", "MistralForCausalLM", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": False,
                                                  "use_sliding_window": False}),
    # Heads twice hidden_size / heads wide, as Qwen3's are (0.6B: 16 x 128 over 1,024).
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"tie_word_embeddings": False,
                                                  "head_dim": 16, "use_sliding_window": False}),
}
# Mixtures of experts, each option of the mapping taken: Qwen3-MoE's normalised top-k, heads
# of their own width and a dense block (mlp_only_layers); Qwen2-MoE's gated shared expert,
# top-k left unnormalised and a dense first block (decoder_sparse_step 2); Mixtral's.
MOE_FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "tie_word_embeddings": False, "head_dim": 16, "use_sliding_window": False,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "norm_topk_prob": True, "mlp_only_layers": [1], "router_aux_loss_coef": 0.05}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "tie_word_embeddings": False, "use_sliding_window": False, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 24, "norm_topk_prob": False,
        "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2,
        "num_hidden_layers": 3, "router_aux_loss_coef": 0.05}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {
        "tie_word_embeddings": False, "num_local_experts": 4, "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.05}),
    # DeepSeek-V3: the queries' latent, YaRN over a sequence past its original context,
    # sigmoid scores with a correction bias (drawn at random), groups scored by their best
    # two, a dense first block, a shared expert, routed_scaling_factor. DeepSeek-V2: queries
    # projected directly, softmax scores, group-limited by each group's best, two shared.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "tie_word_embeddings": False, "num_hidden_layers": 3, "num_key_value_heads": 4,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
        "v_head_dim": 12, "routed_scaling_factor": 2.5, "rope_parameters": {
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
            "rope_theta": 10000.0}}),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
        "tie_word_embeddings": False, "num_hidden_layers": 3, "num_key_value_heads": 4,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "n_shared_experts": 2, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
        "topk_method": "group_limited_greedy", "q_lora_rank": None, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12,
        "routed_scaling_factor": 1.5}),
}


def make_folder(family: str, folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """A randomly initialised `family` model saved to `folder` (fp32 safetensors)."""
    import transformers

    config_name, model_name, extra = {**FAMILIES, **MOE_FAMILIES}[family]
    config = getattr(transformers, config_name)(**{**SHAPE, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    with torch.no_grad():  # biases start at 0 and norms' scales at 1: values to check
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
            elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
                param.normal_(0.0, 1.0)  # routing far from uniform: ties never decide it
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.5)  # the choice differs from the scores' own
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(tokens).logits


def hf_job(folder: Path, steps: int = 4, **sections: Any) -> dict[str, Any]:
    return {"model": {"kind": "hf", "hf": {"path": str(folder)}},
            "data": {"seq_len": 16},
            "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2,
                         "checkpoint_every_steps": steps, "learning_rate": 0.01},
            "resources": {"num_workers": 1},
            **sections}


def pretrained_reads(rank: int, world_size: int, port: int, job: dict[str, Any],
                     local: str, out: str) -> None:
    """One of `world_size` gloo ranks (mp.spawn): build the job's model under its layout and
    load its pretrained weights from model.hf.path (a bucket) and, into a second model, from
    the same folder on disk (`local`); write OUT/read-RANK.json: the bytes this rank fetched,
    the seconds each load took, and whether every tensor it holds is the same."""
    import json
    import os
    import time

    import torch.distributed as dist

    from raytrain.core.resolve import job_layout
    from raytrain.models import hf
    from raytrain.parallel.parallelize import build_parallel_model
    from raytrain.spec import JobSpec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    fetched: dict[str, int] = {}
    try:
        spec = JobSpec.model_validate(job)
        layout, device = job_layout(spec), torch.device("cpu")
        tied = spec.model.gpt.tie_embeddings
        timed = {}
        models = {}
        for where, folder in (("bucket", spec.model.hf.path), ("disk", local)):
            models[where] = build_parallel_model(spec, layout, device)
            began = time.perf_counter()
            fetched[where] = hf.load_pretrained(models[where].parts, folder, tied)
            timed[where] = time.perf_counter() - began
        same = all(torch.equal(_local(a), _local(b)) for a, b in zip(
            models["bucket"].parameters(), models["disk"].parameters()))
        (Path(out) / f"read-{rank}.json").write_text(json.dumps(
            {"bytes": fetched["bucket"], "bucket_s": timed["bucket"], "disk_s": timed["disk"],
             "same": same}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor
