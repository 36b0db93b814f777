"""precision 'fp8': the model's linear layers run their matmuls in float8.

torchao's Float8Linear does the work (dynamic tensorwise scaling: each input, weight and
output gradient scaled by its absolute maximum and cast to float8_e4m3 or e5m2 before
torch's scaled matmul; weights, optimizer state and everything else stay as bf16 training
keeps them), as torchtitan converts its models. This module only picks the layers: every
nn.Linear whose sizes are multiples of 16 (the scaled matmul's requirement), except the
output head (`output` or `lm_head`), whose logits want the precision. Conversion keeps
parameter names, so checkpoints move between precisions and layouts. On a GPU the scaled
matmul needs FP8 tensor cores (the spec checks the accelerator); on CPU torch emulates it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from torch import nn

HEADS = frozenset({"output", "lm_head"})


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """torchao warns at import that its CUDA kernels' libraries cannot load on a CPU-only
    torch (float8 training does not use them), and torch that torchao registers an Enum
    with pytree the old way: neither is the user's concern."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _convertible(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear):
        return True  # a container: look inside
    return (fqn.rsplit(".", 1)[-1] not in HEADS
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def to_float8(model: nn.Module, fsdp_float8_all_gather: bool = False) -> nn.Module:
    """Swap `model`'s eligible linear layers for Float8Linear, in place (meta tensors too:
    convert before parallelising, as torchtitan does). Returns the model.
    `fsdp_float8_all_gather`: FSDP2 gathers their weights already cast to float8 (torchao's
    enable_fsdp_float8_all_gather, torchtitan's default with FSDP on GPUs)."""
    with _quiet("torchao", "torch.utils._pytree"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_float8_all_gather)
    convert_to_float8_training(model, config=config, module_filter_fn=_convertible)
    return model


def float8_layers(model: nn.Module) -> list[str]:
    """Names of the layers that run in float8."""
    return [name for name, module in model.named_modules()
            if type(module).__name__ == "Float8Linear"]
