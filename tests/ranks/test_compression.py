"""Gradient compression through DDP communication hooks, tested for what it puts on the wire:
every collective DDP issues is recorded (a TorchDispatchMode sees torch's c10d ops with their
tensors), in one gloo process. Each test fails if its hook is a no-op: with the plain
all-reduce of fp32 gradients (checked by making register_compression return at once: all five
fail), or for top-k, without its error-feedback residual (the conservation test fails)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from raytrain.parallel.compression import TopKState, register_compression

SIZES = (64, 64, 8)
GRADIENT_VALUES = 64 * 64 + 64 + 64 * 8 + 8


class Wire(TorchDispatchMode):
    """Records each collective: its op, and each tensor's dtype, size and (cloned) values."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if "c10d" in name and "broadcast" not in name:
            for work in tree_leaves(out):  # an asynchronous collective: its outputs once done
                if isinstance(work, torch.ScriptObject) and hasattr(work, "wait"):
                    work.wait()
            tensors = [t.detach().clone() for t in tree_leaves(args)
                       if isinstance(t, torch.Tensor)]
            self.calls.append((name.split(".")[1], tensors))
        return out


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    rendezvous = tmp_path_factory.mktemp("wire") / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.Tanh(),
                               torch.nn.Linear(SIZES[1], SIZES[2]))


def steps(kind: str, count: int, **options: Any) -> tuple[list[Wire], object,
                                                          list[torch.Tensor]]:
    """`count` forward/backward passes of a DDP model with `kind`'s hook; what each put on
    the wire, the hook's state, and each pass's input."""
    ddp = DistributedDataParallel(model())
    state = register_compression(ddp, kind, dist.group.WORLD, **options)
    wires, inputs = [], []
    for step in range(count):
        torch.manual_seed(100 + step)
        batch = torch.randn(4, SIZES[0])
        inputs.append(batch)
        wire = Wire()
        with wire:
            ddp(batch).pow(2).sum().backward()
        wires.append(wire)
        ddp.zero_grad()
    return wires, state, inputs


def sent(wire: Wire) -> list[tuple[str, torch.dtype, int]]:
    return [(op, t.dtype, t.numel()) for op, tensors in wire.calls for t in tensors]


def test_uncompressed_sends_fp32_gradients(one_rank: None) -> None:
    wires, _, _ = steps("none", 1)
    assert sent(wires[0]) == [("allreduce_", torch.float32, GRADIENT_VALUES)]


@pytest.mark.parametrize("kind,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_fp16_and_bf16_send_half_the_bytes(one_rank: None, kind: str,
                                           dtype: torch.dtype) -> None:
    wires, _, _ = steps(kind, 2)
    for wire in wires:
        assert sent(wire) == [("allreduce_", dtype, GRADIENT_VALUES)]


def test_powersgd_sends_low_rank_factors_after_its_warm_up(one_rank: None) -> None:
    """Rank 2: each weight matrix goes as P (rows x 2) and Q (columns x 2); vectors (the
    biases) as they are. The first passes are its plain warm-up."""
    wires, _, _ = steps("powersgd", 3, powersgd_rank=2)
    assert sent(wires[0]) == [("allreduce_", torch.float32, GRADIENT_VALUES)]
    compressed = sum(n for _, _, n in sent(wires[2]))
    matrices = 2 * (SIZES[0] + SIZES[1]) + 2 * (SIZES[1] + SIZES[2])
    assert compressed == matrices + SIZES[1] + SIZES[2]
    assert compressed < GRADIENT_VALUES / 5


def test_topk_sends_only_its_share_of_entries_with_their_indices(one_rank: None) -> None:
    wires, _, _ = steps("topk", 1, topk_ratio=0.05)
    calls = sent(wires[0])
    k = -(-GRADIENT_VALUES * 5 // 100)
    assert ("allgather_", torch.int64, k) in calls and ("allgather_", torch.float32, k) in calls
    assert all(op == "allgather_" for op, _, _ in calls)


def test_topk_error_feedback_carries_what_it_did_not_send(one_rank: None) -> None:
    """Over two passes, what top-k sent plus the residual it carries adds up to the two true
    gradients: nothing is dropped, only delayed. Without the residual the sums differ."""
    wires, state, inputs = steps("topk", 2, topk_ratio=0.05)
    assert isinstance(state, TopKState)
    plain = model()
    true_total = 0.0
    for batch in inputs:
        plain.zero_grad()
        plain(batch).pow(2).sum().backward()
        true_total += sum(p.grad.sum().item() for p in plain.parameters())
    values = [tensors[0] for wire in wires for op, tensors in wire.calls
              if op == "allgather_" and tensors[0].dtype == torch.float32]
    sent_total = sum(v.sum().item() for v in values)
    carried = sum(residual.sum().item() for residual in state.residuals.values())
    assert abs(carried) > 1e-3  # something was held back
    # three fp32 totals over every gradient value, summed in three orders
    assert sent_total + carried == pytest.approx(true_total, rel=1e-4, abs=1e-4)
