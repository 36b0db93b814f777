"""LoRA on the built-in model (training.lora, raytrain.spec.lora): each targeted linear of
every block gains `lora_A` (rank x in) and `lora_B` (out x rank), its output becoming
`W x + (alpha / rank) B A dropout(x)`, as PEFT computes it; every other weight is frozen.
The linear keeps its class's state-dict names (`attention.wq.weight`), so checkpoints, the
pretrained load and FSDP see the base weights where they always are, and the adapters beside
them (`attention.wq.lora_A.weight`). B starts at zero (the model starts as the base model);
A uniform in +-1/sqrt(in), PEFT's default, drawn from a generator seeded by the model's seed
and the parameter's name, so every layout starts from the same adapters.

Out: `adapter_state` names the adapters as PEFT saves them
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`) and `adapter_config` is
PEFT's `adapter_config.json`; `merge` folds them into the base weights (W + scale B A).

Written here rather than with PEFT's own layers: PEFT wraps modules (its names differ from
the built-in model's, which the pretrained load, checkpoints and FSDP's units rely on) and
its layers are not built for the meta device and DTensor shards.

    apply_lora(model, spec.training.lora); freeze_in(model, torch.bfloat16)
    init_lora(model, seed)
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from raytrain.spec.lora import TARGETS, LoraSpec


class LoRALinear(nn.Linear):
    """An nn.Linear with an adapter beside it (module doc); made by `adapt`."""

    lora_A: nn.Linear  # noqa: N815 - PEFT's names, which its adapter files carry
    lora_B: nn.Linear  # noqa: N815
    scaling: float
    lora_dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dropped = F.dropout(x, self.lora_dropout, self.training) if self.lora_dropout else x
        return out + self.lora_B(self.lora_A(dropped)) * self.scaling


def adapt(linear: nn.Linear, spec: LoraSpec) -> LoRALinear:
    """`linear`, now a LoRALinear (the same object: its weights and names stay)."""
    device = linear.weight.device
    linear.__class__ = LoRALinear
    adapted: LoRALinear = linear  # type: ignore[assignment]
    adapted.lora_A = nn.Linear(linear.in_features, spec.rank, bias=False, device=device)
    adapted.lora_B = nn.Linear(spec.rank, linear.out_features, bias=False, device=device)
    adapted.scaling, adapted.lora_dropout = spec.scaling, spec.dropout
    return adapted


def apply_lora(model: nn.Module, spec: LoraSpec) -> None:
    """Adapters on `spec.targets` in every block of a built-in model (or a pipeline stage of
    one); every other parameter frozen."""
    for block in getattr(model, "layers").values():
        for target in spec.targets:
            owner, _, name = TARGETS[target].rpartition(".")
            parent = block.get_submodule(owner)
            linear = getattr(parent, name, None)
            if isinstance(linear, nn.Linear) and not isinstance(linear, LoRALinear):
                adapt(linear, spec)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)


@torch.no_grad()
def freeze_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Keep the frozen weights in `dtype` (bf16 under precision 'bf16': half the memory of
    fp32 for weights no optimizer updates; the adapters stay fp32). On the meta device too."""
    for param in model.parameters():
        if not param.requires_grad:
            param.data = param.data.to(dtype)


@torch.no_grad()
def init_lora(model: nn.Module, seed: int) -> None:
    """B at zero, A uniform in +-1/sqrt(in), from a generator seeded by `seed` and the name;
    a sharded parameter (DTensor) keeps its own slice. After the model's own init."""
    from raytrain.models.gpt import _copy_into

    for name, param in model.named_parameters():
        if name.endswith("lora_B.weight"):
            param.zero_()
        elif name.endswith("lora_A.weight"):
            bound = 1.0 / math.sqrt(param.shape[1])
            generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
            full = torch.empty(tuple(param.shape)).uniform_(-bound, bound, generator=generator)
            _copy_into(param, full)


def _adapted(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


def adapter_state(state: dict[str, torch.Tensor], to_hf: Any) -> dict[str, torch.Tensor]:
    """The adapters of a full (unsharded) state dict, under PEFT's names."""
    found = {}
    for key, tensor in state.items():
        base, marker, rest = key.partition(".lora_")
        if marker:  # layers.0.attention.wq.lora_A.weight -> ...q_proj.lora_A.weight
            hf = to_hf(f"{base}.weight").removesuffix(".weight")
            found[f"base_model.model.{hf}.lora_{rest}"] = tensor.detach().contiguous()
    return found


def adapter_config(spec: LoraSpec, base_model: str) -> dict[str, Any]:
    """PEFT's adapter_config.json for `spec`."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
            "target_modules": sorted(spec.targets), "bias": "none", "fan_in_fan_out": False,
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
            "use_rslora": False, "use_dora": False}


@torch.no_grad()
def merge(model: nn.Module) -> None:
    """Fold every adapter into its base weight (W + scale B A) and take it away: the model
    is the base model's class again, with the adapted weights (unsharded models only)."""
    for _, module in list(_adapted(model)):
        module.weight += module.scaling * (module.lora_B.weight @ module.lora_A.weight)
        del module.lora_A, module.lora_B
        module.__class__ = nn.Linear
