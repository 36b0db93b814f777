"""A model's shape from its Hugging Face `config.json`, as the built-in GPT's dimensions
(GPTConfig), without importing transformers: `raytrain plan --model-config config.json`,
and a job's `model.shape` for a model of the user's own.

Read by hand because the mapping is ours: which of a config's fields change what the planner
prices (widths, heads, layers, the MLP's gate, positions, tied embeddings) and which do not
(token ids, norm epsilons, dropout, dtypes, initialisation, rope scaling). A field that is
neither is an error naming it, as is a missing one and a model the built-in blocks cannot
describe (mixture of experts), so a plan is never of some other model than the user's.

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
MIXTURE_OF_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts",
                      "num_experts_per_tok", "moe_intermediate_size")


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
        if key in MIXTURE_OF_EXPERTS:
            errors.append(FieldError((key,), "a mixture-of-experts model, which the planner "
                                     "does not price (dense blocks only). To fix: plan a "
                                     "dense model"))
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
