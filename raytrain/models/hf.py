"""A Hugging Face Llama-family checkpoint as the built-in model's weights, and back: the
state-dict adapter (names only: the built-in attention rotates as transformers' Llama does,
with rotate_half, so no rotary permutation is needed), pretrained weights loaded with each
rank reading only its slices (DCP's Hugging Face storage reader), and a Hugging Face folder
written from any layout (DCP's Hugging Face storage writer, consolidated into shards with
their index, beside the source's config and tokenizer files).

torchtitan reaches Hugging Face the same way (a state-dict adapter over DCP's Hugging Face
reader and writer); the names are ours, so the adapter is written here.

    load_pretrained(model.parts, "/models/llama", tied=False)
    export_folder(model.parts, "/models/llama", "/runs/job/hf", tied=False)
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raytrain.cloud.object_store import is_remote, open_store
from raytrain.errors import FieldError, SpecError
from raytrain.models.hf_experts import (
    FolderTensors,
    expert_style,
    expert_tensors,
    is_expert,
    load_experts,
    style_of_folder,
)
from raytrain.models.moe import Experts
from raytrain.spec.gpt_config import GPTConfig
from raytrain.spec.lora import LoraSpec

# Ours -> Hugging Face's, for the Llama family (Llama, Mistral, Qwen2, Qwen3).
_TO_HF = (
    (r"^tok_embeddings\.weight$", "model.embed_tokens.weight"),
    (r"^layers\.(\d+)\.attention\.wq\.(weight|bias)$", r"model.layers.\1.self_attn.q_proj.\2"),
    (r"^layers\.(\d+)\.attention\.wk\.(weight|bias)$", r"model.layers.\1.self_attn.k_proj.\2"),
    (r"^layers\.(\d+)\.attention\.wv\.(weight|bias)$", r"model.layers.\1.self_attn.v_proj.\2"),
    (r"^layers\.(\d+)\.attention\.wo\.weight$", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"^layers\.(\d+)\.attention\.q_norm\.weight$", r"model.layers.\1.self_attn.q_norm.weight"),
    (r"^layers\.(\d+)\.attention\.k_norm\.weight$", r"model.layers.\1.self_attn.k_norm.weight"),
    (r"^layers\.(\d+)\.feed_forward\.w1\.weight$", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.w3\.weight$", r"model.layers.\1.mlp.up_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.w2\.weight$", r"model.layers.\1.mlp.down_proj.weight"),
    (r"^layers\.(\d+)\.attention_norm\.weight$", r"model.layers.\1.input_layernorm.weight"),
    (r"^layers\.(\d+)\.ffn_norm\.weight$",
     r"model.layers.\1.post_attention_layernorm.weight"),
    # A mixture of experts (Qwen's names; Mixtral's and DeepSeek's differ: hf_name): the
    # router, and the shared expert with its gate. The routed experts are packed here and
    # one tensor per expert in a folder: raytrain.models.hf_experts.
    (r"^layers\.(\d+)\.feed_forward\.router\.weight$", r"model.layers.\1.mlp.gate.weight"),
    (r"^layers\.(\d+)\.feed_forward\.shared\.w1\.weight$",
     r"model.layers.\1.mlp.shared_expert.gate_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.shared\.w3\.weight$",
     r"model.layers.\1.mlp.shared_expert.up_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.shared\.w2\.weight$",
     r"model.layers.\1.mlp.shared_expert.down_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.shared_gate\.weight$",
     r"model.layers.\1.mlp.shared_expert_gate.weight"),
    # DeepSeek's multi-head latent attention (wq and wo are the rows above), and V3's score
    # correction bias.
    (r"^layers\.(\d+)\.attention\.wq_a\.weight$", r"model.layers.\1.self_attn.q_a_proj.weight"),
    (r"^layers\.(\d+)\.attention\.q_a_norm\.weight$",
     r"model.layers.\1.self_attn.q_a_layernorm.weight"),
    (r"^layers\.(\d+)\.attention\.wq_b\.weight$", r"model.layers.\1.self_attn.q_b_proj.weight"),
    (r"^layers\.(\d+)\.attention\.wkv_a\.weight$",
     r"model.layers.\1.self_attn.kv_a_proj_with_mqa.weight"),
    (r"^layers\.(\d+)\.attention\.kv_norm\.weight$",
     r"model.layers.\1.self_attn.kv_a_layernorm.weight"),
    (r"^layers\.(\d+)\.attention\.wkv_b\.weight$", r"model.layers.\1.self_attn.kv_b_proj.weight"),
    (r"^layers\.(\d+)\.feed_forward\.score_bias$",
     r"model.layers.\1.mlp.gate.e_score_correction_bias"),
    (r"^norm\.weight$", "model.norm.weight"),
    (r"^output\.weight$", "lm_head.weight"),
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "generation_config.json", "vocab.json", "merges.txt",
                   "chat_template.jinja")  # transformers 5 keeps the chat template there
CHAT_TEMPLATES = "additional_chat_templates/"  # and named ones, NAME.jinja, in this folder


def to_hf(name: str) -> str:
    for pattern, replacement in _TO_HF:
        renamed, count = re.subn(pattern, replacement, name)
        if count:
            return renamed
    raise KeyError(f"{name}: no Hugging Face name for this parameter")


def _named(part: nn.Module, tied: bool, style: str = "qwen") -> dict[str, torch.Tensor]:
    """This part's parameters under their Hugging Face names (a tied head is the
    embeddings': not a tensor of its own in the folder), the routed experts' left out
    (raytrain.models.hf_experts reads and writes those)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(part)
    return {hf_name(k, style): v for k, v in state.items()
            if not (tied and k == "output.weight") and ".lora_" not in k  # adapters: ours
            and not is_expert(k)}


def hf_name(name: str, style: str) -> str:
    """Our parameter's Hugging Face name in a folder of `style` (expert_style)."""
    hf = to_hf(name)
    if style == "mixtral":
        return hf.replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")
    return hf.replace(".mlp.shared_expert.", ".mlp.shared_experts.") if "deepseek" in style \
        else hf


def check_shapes(parts: list[nn.Module], folder: str, tied: bool) -> None:
    """Every tensor the parts hold is in the folder with the shape the config gives it;
    SpecError naming the first that is missing or differs."""
    from safetensors import safe_open

    found: dict[str, list[int]] = {}
    if is_remote(folder):  # each file's header, two ranged GETs
        from raytrain.models.hf_bucket import headers

        for tensors in headers(open_store(folder)).values():
            found.update({key: shape for key, (_, shape, _, _) in tensors.items()})
    else:
        from raytrain.models.hf_bucket import INDEX, weight_files

        root = Path(folder).expanduser()
        index = root / INDEX
        names = [path.name for path in root.iterdir()] if root.is_dir() else []
        for name in weight_files(names, index.read_bytes() if index.is_file() else None,
                                 folder):
            with safe_open(str(root / name), framework="pt") as handle:
                for key in handle.keys():
                    found[key] = list(handle.get_slice(key).get_shape())
    here = ("model", "hf", "path")
    style = style_of_folder(found)
    for part in parts:
        expected = {**_named(part, tied, style), **expert_tensors(part, style, found)}
        for name, tensor in expected.items():
            if name not in found:
                raise SpecError([FieldError(here, f"{folder} has no tensor {name}. To fix: "
                                            "give the folder whose config.json this is")])
            if found[name] != list(tensor.shape):
                raise SpecError([FieldError(here, f"{name} is {found[name]} in {folder}, but "
                                            f"its config.json makes it {list(tensor.shape)}. "
                                            "To fix: give matching config and weights")])


def check_folder(config: GPTConfig, folder: str) -> None:
    """At submit: the folder holds every tensor the config's model has, at its shape (read
    from the safetensors headers; nothing is loaded)."""
    from raytrain.models.gpt import GPT

    with torch.device("meta"):
        model = GPT(config)
    check_shapes([model], folder, config.tie_embeddings)


def load_pretrained(parts: list[nn.Module], folder: str, tied: bool) -> int:
    """Load the folder's weights into this rank's parts, in place, each rank reading the
    slices it holds (sharded or not, any layout); shapes checked first. The bytes this rank
    fetched from a bucket (0 from a folder, memory-mapped)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader, load
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    check_shapes(parts, folder, tied)
    fetched = 0
    stored = FolderTensors(folder) if any(isinstance(m, Experts) for part in parts
                                          for m in part.modules()) else None
    style = style_of_folder(stored.keys()) if stored is not None else "qwen"
    for part in parts:
        named = _named(part, tied, style)
        if is_remote(folder):
            from raytrain.models.hf_bucket import BucketHFReader

            reader = BucketHFReader(open_store(folder))
            load(named, storage_reader=reader)
            fetched += reader.bytes_read
        else:
            load(named, storage_reader=HuggingFaceStorageReader(folder))
        inverse = {hf_name(k, style): k for k in part.state_dict()
                   if ".lora_" not in k and not is_expert(k)}
        set_model_state_dict(part, {inverse[k]: v for k, v in named.items()},
                             options=StateDictOptions(strict=False))
        if stored is not None:
            load_experts(part, stored, style)
        tie = getattr(part, "tie_weights", None)
        if callable(tie):
            tie()
    return fetched + (stored.bytes_read if stored is not None else 0)


# The dtypes a folder is written in, by the name config.json gives them.
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}


def export_dtype(config: dict[str, Any], asked: str | None = None) -> str:
    """The dtype a folder is written in: `asked`, else the one the source's config.json
    states (`dtype`, or `torch_dtype` before transformers 5), as save_pretrained of a model
    in it writes; float32 when it states none (or 'auto')."""
    if asked is not None:
        if asked not in EXPORT_DTYPES:
            raise ValueError(f"{asked!r} is not a dtype to export in. To fix: use one of "
                             f"{', '.join(EXPORT_DTYPES)}")
        return asked
    stated = config.get("dtype") or config.get("torch_dtype")
    return stated if stated in EXPORT_DTYPES else "float32"


def export_folder(parts: list[nn.Module], source: str, out: str | Path, tied: bool,
                  dtype: str | None = None) -> Path:
    """Write the parts' weights as a Hugging Face folder at `out` (every rank calls it: each
    writes its slices, then they are consolidated into whole tensors), with the source
    folder's config.json and tokenizer files; `from_pretrained` loads it. In `dtype`, else
    the source config's (export_dtype), and the config written says so."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import HuggingFaceStorageWriter, save

    out = Path(out)
    store = open_store(source)
    config = json.loads(store.get_bytes("config.json") or b"{}")
    written = export_dtype(config, dtype)
    named: dict[str, torch.Tensor] = {}
    style = expert_style(config)
    for part in parts:
        named.update({name: tensor.to(EXPORT_DTYPES[written]) for name, tensor in
                      {**_named(part, tied, style), **expert_tensors(part, style)}.items()})
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    save(named, storage_writer=HuggingFaceStorageWriter(
        str(out), fqn_to_index_mapping=None, save_distributed=True, enable_consolidation=True),
        no_dist=not distributed)
    if rank == 0:
        shutil.rmtree(out / "sharded", ignore_errors=True)
        _copy_tokenizer(source, out)
        config["dtype"] = written  # what the weights are in (transformers 5's name)
        if "torch_dtype" in config:
            config["torch_dtype"] = written
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _copy_tokenizer(source: str, out: Path) -> Any:
    """The source folder's tokenizer files (those it has) copied into `out`; its store (a
    folder or a bucket's prefix)."""
    store = open_store(source)
    for name in TOKENIZER_FILES:
        store.get_file(name, out / name)  # False where the source has none
    for key in store.keys(CHAT_TEMPLATES):
        if key.startswith(CHAT_TEMPLATES) and key.endswith(".jinja"):
            store.get_file(key, out / key)
    return store


def export_adapter(parts: list[nn.Module], lora: LoraSpec, source: str, out: str | Path
                   ) -> Path:
    """The parts' LoRA adapters as a PEFT folder at `out` (adapter_config.json,
    adapter_model.safetensors, and the source folder's tokenizer files), which
    `peft.PeftModel.from_pretrained(base, out)` loads onto the source's model. Every rank
    calls it: a sharded adapter is gathered (the adapters only, not the base weights)."""
    import torch.distributed as dist
    from safetensors.torch import save_file

    from raytrain.models.lora import adapter_config, adapter_state

    state: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, param in part.named_parameters():  # every rank, in the same order
            if ".lora_" in name:
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                state[name] = full.detach().to("cpu", torch.float32)
    distributed = dist.is_available() and dist.is_initialized()
    out = Path(out)
    if not distributed or dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file(adapter_state(state, to_hf), str(out / "adapter_model.safetensors"))
        (out / "adapter_config.json").write_text(
            json.dumps(adapter_config(lora, source), indent=2) + "\n")
        _copy_tokenizer(source, out)
    return out
