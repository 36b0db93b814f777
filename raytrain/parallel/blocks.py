"""Which modules of a model become FSDP2's units: its repeated blocks.

FSDP gathers one unit's parameters at a time; a model wrapped as one unit at its root is
gathered whole for every forward and backward, which undoes its memory saving. torch has no
public "auto-wrap" for FSDP2 (FSDP1's `transformer_auto_wrap_policy` needed the block class,
as Hugging Face's `transformer_layer_cls_to_wrap` does), so this finds them:

- `block_class` given (model.block_class): every module of that class name that is not
  inside another one;
- otherwise the model's largest container (`nn.ModuleList` or `nn.ModuleDict`, by parameter
  count) of two or more children of one class: the built-in GPT's `layers`, a Hugging Face
  Llama's `model.layers`, a GPT-2's `transformer.h`.

    blocks = transformer_blocks(model, block_class=None)   # [] : the root is the only unit
"""

from __future__ import annotations

from torch import nn

from raytrain.errors import FieldError, SpecError


def transformer_blocks(model: nn.Module, block_class: str | None = None) -> list[nn.Module]:
    """The modules to shard one by one (in model order), before the root is sharded."""
    if block_class is not None:
        return _of_class(model, block_class)
    best: list[nn.Module] = []
    best_params = 0
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(child) for child in children}) != 1:
            continue
        params = sum(p.numel() for p in module.parameters())
        if params > best_params:
            best, best_params = children, params
    return best


def _of_class(model: nn.Module, block_class: str) -> list[nn.Module]:
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ == block_class:
            found.append(module)
            inside.update(id(m) for m in module.modules())
    if not found:
        classes = sorted({type(m).__name__ for m in model.modules()
                          if any(True for _ in m.children())})
        raise SpecError([FieldError(("model", "block_class"), (
            f"{type(model).__name__} has no module of class {block_class!r}; its modules that "
            f"hold others are of the classes {', '.join(classes)}. To fix: name the class of "
            "its decoder block (LlamaDecoderLayer for a Hugging Face Llama), or leave "
            "block_class out to find the repeated blocks"))])
    return found


def describe_units(model: nn.Module, blocks: list[nn.Module]) -> str:
    """What FSDP shards, in words: '4 x LlamaDecoderLayer, then the rest at the root'."""
    if not blocks:
        return f"1 unit: the whole {type(model).__name__} at its root"
    names = sorted({type(block).__name__ for block in blocks})
    return f"{len(blocks)} x {'/'.join(names)}, then the rest at the root"
