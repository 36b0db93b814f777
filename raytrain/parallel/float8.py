"""precision 'fp8': the model's linear layers run their matmuls in float8.

torchao's Float8Linear does the work (dynamic tensorwise scaling: each input, weight and
output gradient scaled by its absolute maximum and cast to float8_e4m3 or e5m2 before
torch's scaled matmul; weights, optimizer state and everything else stay as bf16 training
keeps them), as torchtitan converts its models. This module only picks the layers: every
nn.Linear whose sizes are multiples of 16 (the scaled matmul's requirement), except the
output head (`output` or `lm_head`), whose logits want the precision. Conversion keeps
parameter names, so checkpoints move between precisions and layouts. On a GPU the scaled
matmul needs FP8 tensor cores (the spec checks the accelerator); on CPU torch runs it through
oneDNN, which some CPUs (and oneDNN held to an older instruction set with
ONEDNN_MAX_CPU_ISA) cannot: `cpu_float8_unsupported()` finds out, once per process, by
training one tiny float8 linear in a child process (a CPU without the kernels raises deep
in a worker; a child keeps whatever it does away from the caller).
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
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


# One float8 linear's forward and backward in bf16, as training runs them: the input and
# weight in e4m3, the output gradient in e5m2 (torchao's casts and torch._scaled_mm).
_PROBE = """
import torch
from torch import nn
from raytrain.parallel.float8 import to_float8
layer = to_float8(nn.Sequential(nn.Linear(32, 32))).to(torch.bfloat16)
x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
layer(x).float().sum().backward()
assert x.grad is not None and bool(torch.isfinite(x.grad).all())
"""


@functools.cache
def cpu_float8_unsupported(probe: str = _PROBE, timeout_s: float = 300.0) -> str | None:
    """None if this machine's CPU runs float8 matmuls; else why not (the child's last
    error line), for a test's skip reason or a job's refusal. `probe`: the Python code
    the child runs (a failing one, in its test).

        if (why := cpu_float8_unsupported()) is not None: ...
    """
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"a float8 matmul on this CPU did not finish in {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"a float8 matmul on this CPU exited {done.returncode}"


def cpu_float8_refusal(why: str) -> str:
    """What a job asking for fp8 on a CPU that cannot run it is told: the field, the
    hardware it needs and the fix."""
    return (f"fp8 needs float8 matmuls, and this node's CPU cannot run them ({why}): on "
            "CPUs torch runs them through oneDNN, which needs AVX-512 FP16 (Intel Sapphire "
            "Rapids or later, AMD Zen 4 or later). To fix: use 'bf16', or train fp8 on GPUs "
            "with FP8 tensor cores (resources.accelerator)")
