"""A mixture of experts' routed experts between a Hugging Face folder and the built-in model:
packed here (one tensor per projection over all experts, raytrain.models.moe.Experts), and in
a folder either one tensor per expert (what model hubs hold and what `save_pretrained`
writes: Qwen's `mlp.experts.N.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.N.w1
.weight`) or packed as transformers 5 keeps them in memory (`mlp.experts.gate_up_proj`
[experts, 2 x ffn, dim], `mlp.experts.down_proj` [experts, dim, ffn]). Both are read; each
rank reads only the experts it holds (its FSDP shard's rows of experts, or its expert-parallel
slice): per expert, the whole tensors of its experts; packed, the rows of its experts, one
ranged read each (a bucket's too, as raytrain.models.hf_bucket reads slices). Exports write
the hub's layout, which `from_pretrained` loads.

Written by hand: DCP's Hugging Face reader maps one stored tensor to one tensor of ours, and
here one tensor of ours is many stored ones (or a slice of one stored pair).

    stored = FolderTensors("/models/qwen3-moe")
    load_experts(model, stored, style_of_folder(stored.keys()))  # "qwen", "mixtral", "packed"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from raytrain.cloud.object_store import is_remote, open_store
from raytrain.models.moe import Experts

PER_EXPERT = {"qwen": {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
              "mixtral": {"w1": "w1", "w3": "w3", "w2": "w2"}}
PER_EXPERT["deepseek"] = PER_EXPERT["qwen"]  # and its shared experts' names (models.hf)
BLOCK = {"qwen": "mlp", "mixtral": "block_sparse_moe", "deepseek": "mlp"}


def is_expert(name: str) -> bool:
    """Whether our parameter `name` is a routed expert's packed weight."""
    return ".feed_forward.experts.w" in name


def expert_style(config: dict[str, Any]) -> str:
    """How a folder of this config names its experts when written (the hub's layout)."""
    architecture = (config.get("architectures") or [""])[0]
    if architecture.startswith("Deepseek"):
        return "deepseek"
    return "mixtral" if architecture == "MixtralForCausalLM" else "qwen"


def style_of_folder(keys: Any) -> str:
    """How a folder's tensors name its experts, from their names."""
    deepseek = any(".mlp.shared_experts." in key for key in keys)
    if any(key.endswith(".mlp.experts.gate_up_proj") for key in keys):
        return "packed_deepseek" if deepseek else "packed"
    if deepseek:
        return "deepseek"
    return "mixtral" if any(".block_sparse_moe." in key for key in keys) else "qwen"


def _experts(part: nn.Module) -> list[tuple[int, Experts]]:
    """(block index, its Experts) of the part."""
    found = []
    for name, module in part.named_modules():
        if isinstance(module, Experts):
            found.append((int(name.split("layers.")[1].split(".")[0]), module))
    return found


def _per_expert_name(layer: int, e: int, weight: str, style: str) -> str:
    return f"model.layers.{layer}.{BLOCK[style]}.experts.{e}.{PER_EXPERT[style][weight]}.weight"


def expert_tensors(part: nn.Module, style: str, found: dict[str, Any] | None = None
                   ) -> dict[str, torch.Tensor]:
    """The part's experts under the folder's names: with `found` (a check of the folder's
    shapes), tensors on the meta device of the shapes each name must have; else the
    experts' weights, gathered whole (an export)."""
    named: dict[str, torch.Tensor] = {}
    for layer, module in _experts(part):
        weights = {w: getattr(module, w) for w in ("w1", "w3", "w2")}
        if found is not None:
            shapes = {w: (module.total, *p.shape[1:]) for w, p in weights.items()}
            if style.startswith("packed"):
                ffn, dim = shapes["w1"][1:]
                named[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.empty(
                    (module.total, 2 * ffn, dim), device="meta")
                named[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.empty(
                    shapes["w2"], device="meta")
                continue
            for w, shape in shapes.items():
                for e in range(module.total):
                    named[_per_expert_name(layer, e, w, style)] = torch.empty(
                        shape[1:], device="meta")
            continue
        for w, param in weights.items():
            whole = _whole(param, module)
            for e in range(module.total):
                named[_per_expert_name(layer, e, w, style)] = whole[e]
    return named


def _whole(param: torch.Tensor, module: Experts) -> torch.Tensor:
    """All the experts of `param` on every rank (FSDP's shards or expert parallelism's
    slices gathered)."""
    if isinstance(param, DTensor):
        return param.full_tensor().detach()
    gather = getattr(module, "gather", None)
    return gather(param.detach()) if callable(gather) else param.detach()


def _local_rows(param: torch.Tensor, module: Experts) -> tuple[int, int, torch.Tensor]:
    """(first expert, how many, the tensor holding them) of what this rank holds."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements)
        return offset[0], shape[0], param.to_local()
    return module.first, param.shape[0], param.data


@torch.no_grad()
def load_experts(part: nn.Module, tensors: FolderTensors, style: str) -> None:
    """Read this rank's experts of every block from the folder's tensors into the part, in
    place (the bytes fetched from a bucket: tensors.bytes_read)."""
    for layer, module in _experts(part):
        for w in ("w1", "w3", "w2"):
            first, count, local = _local_rows(getattr(module, w), module)
            if not count:
                continue
            if style.startswith("packed"):
                prefix = f"model.layers.{layer}.mlp.experts."
                if w == "w2":
                    rows = tensors.rows(prefix + "down_proj", first, count)
                else:
                    ffn = local.shape[1]
                    both = tensors.rows(prefix + "gate_up_proj", first, count)
                    rows = both[:, :ffn] if w == "w1" else both[:, ffn:]
            else:
                rows = torch.stack([tensors.whole(_per_expert_name(layer, e, w, style))
                                    for e in range(first, first + count)])
            local.copy_(rows.to(local.dtype))


class FolderTensors:
    """The safetensors of a model folder (on disk, memory-mapped, or in a bucket: each
    file's header, then ranged reads), by tensor name."""

    def __init__(self, folder: str) -> None:
        from raytrain.models.hf_bucket import INDEX, headers, weight_files

        self.bytes_read = 0
        self._where: dict[str, tuple[str, Any]] = {}
        if is_remote(folder):
            self._store = open_store(folder)
            for key, tensors in headers(self._store).items():
                self.bytes_read += min((t[2] for t in tensors.values()), default=0)  # header
                for name, header in tensors.items():
                    self._where[name] = (key, header)
            self._handles: dict[str, Any] = {}
            return
        from safetensors import safe_open

        root = Path(folder).expanduser()
        index = root / INDEX
        names = [path.name for path in root.iterdir()] if root.is_dir() else []
        self._handles = {}
        for name in weight_files(names, index.read_bytes() if index.is_file() else None,
                                 folder):
            handle = safe_open(str(root / name), framework="pt")
            self._handles[name] = handle
            for key in handle.keys():
                self._where[key] = (name, None)

    def keys(self) -> set[str]:
        return set(self._where)

    def whole(self, key: str) -> torch.Tensor:
        file, header = self._where[key]
        if header is None:
            return self._handles[file].get_tensor(key)
        return self.rows(key, 0, header[1][0])

    def rows(self, key: str, first: int, count: int) -> torch.Tensor:
        """Rows [first, first + count) of dimension 0 of the stored tensor `key`."""
        file, header = self._where[key]
        if header is None:
            return self._handles[file].get_slice(key)[first:first + count]
        dtype, shape, start, _ = header
        row = torch.tensor([], dtype=dtype).element_size()
        for extent in shape[1:]:
            row *= extent
        data = self._store.get_range(file, start + first * row, count * row)
        self.bytes_read += len(data)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape([count, *shape[1:]])

