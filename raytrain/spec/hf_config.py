"""A model's shape from its Hugging Face `config.json`, as the built-in GPT's dimensions
(GPTConfig), without importing transformers: `raytrain plan --model-config config.json`,
and a job's `model.shape` for a model of the user's own.

Read by hand because the mapping is ours: which of a config's fields change what the planner
prices (widths, heads, layers, the MLP's gate, positions, tied embeddings) and which do not
(token ids, norm epsilons, dropout, dtypes, initialisation, rope scaling). A field that is
neither is an error naming it, as is a missing one and a model the built-in blocks cannot
describe, so a plan is never of some other model than the user's. A mixture of experts as
Qwen3-MoE, Qwen2-MoE and Mixtral write it maps onto GPTConfig.moe (`moe_config`).

    shape = gpt_config_from_hf(json.loads(Path("config.json").read_text()), "config.json")
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from raytrain.errors import FieldError, SpecError
from raytrain.spec.gpt_config import GPTConfig

# Our field: the config's names for it (Llama-style first, GPT-2's after).
NAMES = {
    "dim": ("hidden_size", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads",),
    "ffn_dim": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions"),
    "tie_embeddings": ("tie_word_embeddings",),
    "rope_theta": ("rope_theta",),
}
REQUIRED = ("dim", "num_layers", "num_heads", "vocab_size")
GATED_ACTIVATIONS = ("silu", "swish")  # Llama, Mistral, Qwen: SwiGLU
PLAIN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu")
LEARNED_POSITIONS = ("gpt2", "gpt_neo", "opt")  # model types with a position table
TIED_BY_DEFAULT = ("gpt2", "gpt_neo", "opt")  # transformers' default where the key is absent
# Fields that do not change the shape the planner prices (head_dim is read on its own).
IGNORED = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "use_cache", "initializer_range", "rope_scaling", "rope_parameters", "pretraining_tp",
    "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers",
    "layer_types", "n_ctx", "activation_function", "hidden_act", "head_dim", "auto_map",
    "task_specific_params", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "add_cross_attention", "use_return_dict", "return_dict",
    "output_attentions", "output_hidden_states", "problem_type", "id2label", "label2id",
    "tokenizer_class", "prefix", "is_decoder", "is_encoder_decoder",
}
IGNORED_SUFFIXES = ("_token_id", "_token_ids", "_dropout", "_pdrop", "_eps", "_epsilon")
IGNORED_PREFIXES = ("_", "summary_")
# A mixture of experts: the fields moe_config reads (the experts' count under each family's
# name; transformers 5 writes Qwen3-MoE's num_experts as num_local_experts), and those it
# reads as what they do not change (output_router_logits: whether transformers' forward adds
# the balancing loss; raytrain always does, with its coefficient).
EXPERT_COUNT = ("num_experts", "num_local_experts")
MIXTURE_OF_EXPERTS = (*EXPERT_COUNT, "num_experts_per_tok", "moe_intermediate_size",
                      "norm_topk_prob", "shared_expert_intermediate_size",
                      "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
                      "router_jitter_noise", "output_router_logits", "qkv_bias")
# DeepSeek-V2's and V3's: multi-head latent attention (mla_config) and group-limited routing;
# and what does not change the model (its multi-token prediction layers are not trained:
# the checkpoint's tensors for them are left unread).
DEEPSEEK = ("n_routed_experts", "kv_lora_rank", "q_lora_rank", "topk_method",
            "scoring_func", "n_group", "topk_group", "first_k_dense_replace",
            "routed_scaling_factor", "n_shared_experts", "qk_rope_head_dim",
            "qk_nope_head_dim", "v_head_dim", "rope_interleave")
DEEPSEEK_IGNORED = ("num_nextn_predict_layers", "qk_head_dim", "ep_size", "moe_layer_freq",
                    "aux_loss_alpha", "seq_aux")
SCORING = {"DeepseekV2ForCausalLM": "softmax", "DeepseekV3ForCausalLM": "sigmoid"}
TOPK_METHODS = {"DeepseekV2ForCausalLM": ("greedy", "group_limited_greedy"),
                "DeepseekV3ForCausalLM": ("noaux_tc",)}


def gpt_config_from_hf(config: Any, source: str) -> GPTConfig:
    """The built-in GPT's dimensions for a Hugging Face config document; SpecError naming
    each field that is missing, unknown or not describable, with the fix."""
    if not isinstance(config, dict):
        raise SpecError([FieldError((), "a model config is a JSON object of fields "
                                    "(hidden_size, num_hidden_layers, ...). To fix: point at "
                                    "the model's config.json")], source)
    errors: list[FieldError] = []
    model_type = str(config.get("model_type", ""))
    known = {name for names in NAMES.values() for name in names}
    for key in config:
        if key in DEEPSEEK or key in DEEPSEEK_IGNORED or key in MIXTURE_OF_EXPERTS:
            continue  # moe_config's and mla_config's
        elif key not in known and key not in IGNORED and not key.endswith(
                IGNORED_SUFFIXES) and not key.startswith(IGNORED_PREFIXES):
            errors.append(FieldError((key,), "not a field the planner knows, so it cannot "
                                     "tell whether it changes the model's size. To fix: "
                                     "remove it if it does not (the fields read are "
                                     f"{', '.join(sorted(known))})"))
    found: dict[str, Any] = {}
    for ours, names in NAMES.items():
        present = [name for name in names if config.get(name) is not None]
        if present:
            found[ours] = config[present[0]]
        elif ours in REQUIRED:
            errors.append(FieldError((names[0],), f"missing: the model's {ours.replace('_', ' ')}"
                                     f". To fix: add {names[0]}"))
    activation = config.get("hidden_act", config.get("activation_function", "gelu"))
    if activation in GATED_ACTIVATIONS:
        found["mlp"] = "swiglu"
    elif activation not in PLAIN_ACTIVATIONS:
        name = "hidden_act" if "hidden_act" in config else "activation_function"
        errors.append(FieldError((name,), f"{activation!r}: the MLPs the planner prices are "
                                 f"gated {GATED_ACTIVATIONS} (SwiGLU) or plain "
                                 f"{PLAIN_ACTIVATIONS}. To fix: use one of those"))
    found["positions"] = "learned" if model_type in LEARNED_POSITIONS else "rotary"
    if "tie_embeddings" not in found:
        found["tie_embeddings"] = model_type in TIED_BY_DEFAULT
    dim, heads = found.get("dim"), found.get("num_heads")
    head_dim = config.get("head_dim")
    if head_dim is not None and isinstance(dim, int) and isinstance(heads, int) and heads \
            and head_dim * heads != dim:
        found["head_dim"] = head_dim  # heads of their own width (Qwen3)
    moe, moe_errors = moe_config(config)
    errors += moe_errors
    if moe is not None:
        found["moe"] = moe
    if config.get("kv_lora_rank"):
        widths = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        lacking = [k for k in widths if not isinstance(config.get(k), int)]
        errors += [FieldError((k,), "multi-head latent attention (kv_lora_rank) needs each "
                              f"head's widths. To fix: add {k}") for k in lacking]
        if not lacking:
            found["mla"] = {k: config.get(k) for k in ("q_lora_rank", "kv_lora_rank", *widths)}
            found["mla"]["rope_interleave"] = bool(config.get("rope_interleave", True))
            found["head_dim"] = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    if errors:
        raise SpecError(errors, source)
    try:
        return GPTConfig.model_validate(found)
    except ValidationError as exc:
        back = {ours: names[0] for ours, names in NAMES.items()}
        raise SpecError([FieldError(
            tuple(back.get(str(part), str(part)) for part in error["loc"]),
            f"{error['msg']} (read as model.gpt.{'.'.join(map(str, error['loc']))})")
            for error in exc.errors()], source) from None


def moe_config(config: dict[str, Any]) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """GPTConfig.moe's fields for a config of Qwen3-MoE's, Qwen2-MoE's or Mixtral's, or None
    for a dense one; with an error for each field whose meaning the blocks do not have."""
    count = next((config[k] for k in (*EXPERT_COUNT, "n_routed_experts") if config.get(k)),
                 None)
    if not count:
        return None, []
    architecture = (config.get("architectures") or [""])[0]
    if architecture in SCORING:
        return _deepseek_moe(config, architecture, count)
    errors = []
    layers = config.get("num_hidden_layers") or 0
    step = config.get("decoder_sparse_step") or 1
    only = config.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1 or not isinstance(only, list):
        errors.append(FieldError(("decoder_sparse_step",), f"{step!r} / mlp_only_layers "
                                 f"{only!r}: a positive step and a list of block indices. "
                                 "To fix: give those"))
        step, only = 1, []
    if config.get("router_jitter_noise"):
        errors.append(FieldError(("router_jitter_noise",), "noise on the router's logits in "
                                 "training is not implemented. To fix: set it to 0"))
    dense = sorted({i for i in range(layers) if i in only or (i + 1) % step})
    mixtral = "num_experts" not in config and "moe_intermediate_size" not in config
    return {
        "num_experts": count, "top_k": config.get("num_experts_per_tok", 2),
        # Mixtral's experts are its MLPs: intermediate_size wide, top-k always normalised.
        "expert_ffn_dim": config.get("moe_intermediate_size") or config.get(
            "intermediate_size") or 1,
        "norm_topk": True if mixtral else bool(config.get("norm_topk_prob", False)),
        "shared_ffn_dim": config.get("shared_expert_intermediate_size") or 0,
        "shared_gate": bool(config.get("shared_expert_intermediate_size")),
        "dense_layers": dense,
        "aux_loss_coef": float(config.get("router_aux_loss_coef", 0.001)),
    }, errors


def _deepseek_moe(config: dict[str, Any], architecture: str, count: int
                  ) -> tuple[dict[str, Any], list[FieldError]]:
    """GPTConfig.moe for DeepSeek-V2 (softmax scores, greedy or group-limited by each group's
    best expert) and V3 (sigmoid scores with the correction bias, group-limited by each
    group's best two, normalised); the first first_k_dense_replace blocks dense."""
    errors = []
    scoring = config.get("scoring_func", SCORING[architecture])
    if scoring != SCORING[architecture]:
        errors.append(FieldError(("scoring_func",), f"{scoring!r}: {architecture} scores "
                                 f"experts by {SCORING[architecture]}, as transformers "
                                 f"does. To fix: {SCORING[architecture]!r}"))
    method = config.get("topk_method", TOPK_METHODS[architecture][0])
    if method not in TOPK_METHODS[architecture]:
        errors.append(FieldError(("topk_method",), f"{method!r}: {architecture} routes by "
                                 f"{', '.join(TOPK_METHODS[architecture])}. To fix: one of "
                                 "those"))
    v3 = architecture == "DeepseekV3ForCausalLM"
    groups = int(config.get("n_group") or 1)
    if not v3 and method == "greedy":
        groups = 1
    dense = int(config.get("first_k_dense_replace") or 0)
    return {
        "num_experts": count, "top_k": config.get("num_experts_per_tok", 2),
        "expert_ffn_dim": config.get("moe_intermediate_size") or 1,
        "norm_topk": bool(config.get("norm_topk_prob", True)) if v3 else False,
        "shared_ffn_dim": (config.get("moe_intermediate_size") or 0) * int(
            config.get("n_shared_experts") or 0),
        "dense_layers": list(range(min(dense, config.get("num_hidden_layers") or 0))),
        "scoring": SCORING[architecture], "groups": groups,
        "top_groups": int(config.get("topk_group") or 1) if groups > 1 else 1,
        "group_score": "top2" if v3 else "max",
        "routed_scaling": float(config.get("routed_scaling_factor") or 1.0),
        "score_bias": v3, "aux_loss_coef": 0.0,  # transformers adds no balancing loss
    }, errors
