"""A Hugging Face model folder as the built-in model: `model.kind: hf` reads the folder's
`config.json` (without importing transformers) and maps the Llama family onto the built-in
decoder's dimensions and blocks, so every layout, the planner and the policy work for it
unchanged (raytrain.models.hf maps the weights).

Supported, as transformers defines them: `LlamaForCausalLM` (Llama 2 and 3, with Llama 3.x's
rotary scaling and the tied embeddings of the 1B and 3B models), `MistralForCausalLM`,
`Qwen2ForCausalLM` (biases on q, k and v) and `Qwen3ForCausalLM` (each head's query and key
normalised, heads of their own width, `head_dim`); and the mixtures of experts
`Qwen3MoeForCausalLM` (normalised top-k, `decoder_sparse_step`, `mlp_only_layers`),
`Qwen2MoeForCausalLM` (the gated shared expert) and `MixtralForCausalLM`, their experts in
the sparse blocks (raytrain.models.moe); and `DeepseekV2ForCausalLM` and
`DeepseekV3ForCausalLM` (multi-head latent attention with or without the queries' latent,
YaRN's rotary scaling, dense first blocks, shared experts, softmax or sigmoid scores,
group-limited routing, routed_scaling_factor, V3's score correction bias).
A sliding window (Mistral's
`sliding_window`, 4,096 in transformers' own default; Qwen's `use_sliding_window` and
`layer_types`) is trained for sequences within it, where it is exactly full causal attention
(every position sees all before it): the model's positions are then the window's, and a
longer `data.seq_len` is refused. Anything else,
and any config field whose meaning the built-in blocks do not implement, is refused naming
the field and what to do instead. Read by hand because the mapping is ours (the shape part is
raytrain.spec.hf_config's, shared with `raytrain plan --model-config`).

    gpt = derived_gpt(HFSource(path="/models/llama-3.2-1b"))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import Field

from raytrain.errors import FieldError, RaytrainError, SpecError
from raytrain.spec._base import Strict
from raytrain.spec.gpt_config import GPTConfig, RopeScaling, YarnScaling
from raytrain.spec.hf_config import gpt_config_from_hf
from raytrain.spec.local_paths import relative_hint

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM",
                 "MixtralForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
QKV_BIAS = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")  # q, k, v biases (Qwen2-MoE: qkv_bias)
QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")  # each head's query and key normalised
# Mixtures of experts not (yet) in the built-in blocks, and why, for the refusal.
NOT_YET = {
    "GptOssForCausalLM": "attention sinks, biased experts and a clamped SwiGLU",
}
HERE = ("model", "hf", "path")
# What reads a file of a model folder given by URI, by scheme: (folder, name) -> its bytes, or
# None if there is none. s3: raytrain.cloud.object_store registers its reader when imported
# (the service and every worker import it); spec itself reaches no bucket.
FOLDER_READERS: dict[str, Callable[[str, str], bytes | None]] = {}
INSTEAD = ("To fix: train it as model.kind 'import' with model.factory "
           "'PACKAGE.MODULE:FUNCTION' (a function of yours returning the transformers model, "
           "e.g. AutoModelForCausalLM.from_pretrained of the folder) and parallel.strategy "
           "'data' or 'fsdp', on a service started with --allow-import PACKAGE")


class HFSource(Strict):
    """A Hugging Face model folder: config.json and safetensors weights."""

    path: str = Field(max_length=1024, description=(
        "The model folder (config.json, model.safetensors or its shards with their index, "
        "and the tokenizer's files): a path on storage every node mounts, or s3://BUCKET/"
        "PREFIX through the service's storage settings (each rank fetches its slices)."))
    weights: Literal["pretrained", "random"] = Field("pretrained", description=(
        "'pretrained': the folder's weights, each rank reading only the slices it holds; "
        "'random': the built-in initialisation of the same architecture (pretraining)."))


def read_config(source: HFSource) -> dict[str, Any]:
    """The folder's config.json (in a folder, or a bucket through the service's storage
    settings); SpecError naming model.hf.path when it cannot be read."""
    config: Path | str = Path(source.path).expanduser() / "config.json"
    try:
        scheme, found, _ = source.path.partition("://")
        if found:
            config = f"{source.path.rstrip('/')}/config.json"
            reader = FOLDER_READERS.get(scheme)
            if reader is None:
                raise OSError(f"nothing here reads {scheme}:// (the service does, with its "
                              "storage settings)")
            data = reader(source.path, "config.json")
            if data is None:
                raise OSError(f"no {config}")
            document = json.loads(data)
        else:
            document = json.loads(Path(config).read_text())
    except (OSError, ValueError, RaytrainError) as exc:
        raise SpecError([FieldError(HERE, f"cannot read {config}: {exc}"
                                    f"{relative_hint(source.path)}. To fix: give a "
                                    "Hugging Face model folder (save_pretrained's output) "
                                    "that the service's node can read")]) from None
    if not isinstance(document, dict):
        raise SpecError([FieldError(HERE, f"{config} is not a JSON object of fields")])
    return document


def derived_gpt(source: HFSource) -> GPTConfig:
    """The built-in model's configuration for the folder's model (module doc)."""
    config = read_config(source)
    errors = _unsupported(config)
    if errors:  # the job's field is the folder; the message names the config's own field
        raise SpecError([FieldError(HERE, f"{source.path}/config.json's {error.path}: "
                                    f"{error.msg}") for error in errors])
    shape = gpt_config_from_hf(config, f"{source.path}/config.json")
    theta, scaling = _rope(config)
    window = _window(config)
    return shape.model_copy(update={
        "max_seq_len": shape.max_seq_len if window is None else min(shape.max_seq_len, window),
        "rope_theta": theta,
        "norm_eps": config.get("rms_norm_eps"),
        "qkv_bias": config["architectures"][0] in QKV_BIAS and bool(
            config.get("qkv_bias", True)),
        "qk_norm": config["architectures"][0] in QK_NORM,
        "unread_layers": int(config.get("num_nextn_predict_layers") or 0),
        "rope_scaling": None if scaling is None or _kind(scaling) != "llama3" else
        RopeScaling.model_validate({k: scaling[k] for k in RopeScaling.model_fields}),
        "rope_yarn": None if scaling is None or _kind(scaling) != "yarn" else
        YarnScaling.model_validate({k: scaling[k] for k in YarnScaling.model_fields
                                    if scaling.get(k) is not None}),
    })


def _kind(scaling: Any) -> Any:
    return scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) \
        else scaling


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """The rotary base and scaling, as transformers 4 writes them (rope_theta, rope_scaling)
    or 5 (rope_parameters with rope_theta and rope_type inside); scaling None: plain."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        theta = parameters.get("rope_theta", config.get("rope_theta", 10_000.0))
        kind = parameters.get("rope_type", parameters.get("type", "default"))
        return float(theta), None if kind == "default" else parameters
    return float(config.get("rope_theta", 10_000.0)), config.get("rope_scaling")


def _window(config: dict[str, Any]) -> Any:
    """The attention window the config sets on some or all of its layers, or None: Mistral's
    `sliding_window` applies to every layer; Qwen's only with `use_sliding_window` or where
    `layer_types` names sliding layers."""
    layers = config.get("layer_types") or []
    applies = (config["architectures"][0] in ("MistralForCausalLM", "MixtralForCausalLM")
               or bool(config.get("use_sliding_window")) or "sliding_attention" in layers)
    return config.get("sliding_window") if applies else None


def _unsupported(config: dict[str, Any]) -> list[FieldError]:
    """What in `config` the built-in blocks do not implement, each with what to do."""
    errors = []
    architectures = config.get("architectures") or []
    if len(architectures) == 1 and architectures[0] in NOT_YET:
        errors.append(FieldError(("architectures",), f"{architectures[0]}: its "
                                 f"{NOT_YET[architectures[0]]} are not in the built-in blocks; "
                                 f"the mixtures of experts trained are Qwen3MoeForCausalLM, "
                                 f"Qwen2MoeForCausalLM, MixtralForCausalLM and DeepSeek-V2 and "
                                 f"V3. {INSTEAD}"))
        return errors
    if len(architectures) != 1 or architectures[0] not in ARCHITECTURES:
        errors.append(FieldError(("architectures",), f"{architectures}: the architectures "
                                 f"trained as the built-in model are {', '.join(ARCHITECTURES)}"
                                 f". {INSTEAD}"))
        return errors
    if config.get("hidden_act", "silu") != "silu":
        errors.append(FieldError(("hidden_act",), f"{config['hidden_act']!r}: the Llama "
                                 f"family's MLP is SwiGLU (silu). {INSTEAD}"))
    for field in ("attention_bias", "mlp_bias"):
        if config.get(field):
            errors.append(FieldError((field,), f"biases on every projection ({field}) are not "
                                     f"in the built-in blocks. {INSTEAD}"))
    window = _window(config)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                               or window < 1):
        errors.append(FieldError(("sliding_window",), f"{window!r}: an attention window is a "
                                 "positive number of tokens. To fix: give one, or null"))
    layers = config.get("layer_types") or []
    if any(kind not in ("full_attention", "sliding_attention") for kind in layers) or (
            "sliding_attention" in layers and window is None):
        errors.append(FieldError(("layer_types",), f"{sorted(set(layers))}: the layers "
                                 "trained attend in full, or over a sliding_window (within "
                                 f"which sequences are kept). {INSTEAD}"))
    _, scaling = _rope(config)
    if scaling is not None and _kind(scaling) == "yarn" and config.get("kv_lora_rank"):
        if not all(scaling.get(k) for k in ("factor", "original_max_position_embeddings")):
            errors.append(FieldError(("rope_parameters",), f"{scaling!r}: YaRN needs factor "
                                     "and original_max_position_embeddings. To fix: give "
                                     "them"))
    elif scaling is not None:
        kind = _kind(scaling)
        if kind != "llama3" or not all(k in scaling for k in RopeScaling.model_fields):
            name = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
            errors.append(FieldError((name,), f"{scaling!r}: the rotary scaling "
                                     "implemented is Llama 3's (rope_type 'llama3' with "
                                     f"{', '.join(RopeScaling.model_fields)}). {INSTEAD}"))
    return errors
