"""Expert parallelism for a mixture of experts (Layout.ep), as torchtitan's does it: the experts
of every sparse block split over `ep` of the fully sharded data ranks (contiguous ranks of
dp_shard form an expert group), each token's hidden state sent to the rank holding its expert
and back by all-to-all, in the forward and (autograd's all_to_all_single) the backward. The
other weights stay fully sharded (FSDP2 leaves the experts alone: `ignored`).

Each expert weight is a DTensor on a 2-D mesh over the same ranks, ("edp", "ep"): sharded
by expert over "ep", replicated over "edp" (the expert groups), so a checkpoint holds each
expert once and resumes under another `ep` (DCP reshards it), and the gradient norm and the
optimizer see one tensor. Its gradient on a rank is the sum over its expert group's tokens;
`sync_expert_grads` sums it over "edp" and divides by dp_shard, which makes it the mean over
the data ranks that FSDP2's reduce-scatter makes of every other gradient.

    ep_mesh = expert_mesh(mesh, layout)                   # ("edp", "ep")
    apply_expert_parallel(model, ep_mesh)                 # before fully_shard
    fully_shard(..., ignored_params=expert_params(model))
    ...; loss.backward(); sync_expert_grads(model, ep_mesh, layout.dp_shard)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.nn.functional import all_to_all_single
from torch.distributed.tensor import DTensor, Replicate, Shard

from raytrain.models.moe import Experts, MoE
from raytrain.spec.layout import Layout


def expert_mesh(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """The job mesh's data ranks as (expert groups, ranks of a group): dp_shard split into
    (dp_shard / ep, ep), so that a group is ep neighbouring ranks (one node's, where they
    fit). Expert parallelism runs without tensor or pipeline parallelism and within one
    replica (JobSpec refuses the rest)."""
    ranks = mesh.mesh.reshape(layout.dp_shard // layout.ep, layout.ep)
    return DeviceMesh(mesh.device_type, ranks, mesh_dim_names=("edp", "ep"))


def expert_params(model: nn.Module) -> set[nn.Parameter]:
    return set(_in_order(model))


def _in_order(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, Experts) for p in m.parameters()]


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Each block's experts as this rank's slice (on whatever device the model is, the meta
    device before materialising), and its MoE dispatching tokens over the "ep" ranks."""
    ep = ep_mesh["ep"].size()
    for module in model.modules():
        if isinstance(module, MoE):
            module.dispatch = Dispatch(ep_mesh["ep"].get_group(), ep, module.moe.num_experts // ep)
        if not isinstance(module, Experts):
            continue
        for name in ("w1", "w2", "w3"):
            whole = getattr(module, name)
            local = torch.empty((whole.shape[0] // ep, *whole.shape[1:]), dtype=whole.dtype,
                                device=whole.device)
            sharded = DTensor.from_local(local, ep_mesh, [Replicate(), Shard(0)],
                                         run_check=False, shape=whole.shape,
                                         stride=whole.stride())
            setattr(module, name, nn.Parameter(sharded, requires_grad=whole.requires_grad))


def sync_expert_grads(model: nn.Module, ep_mesh: DeviceMesh, dp_shard: int) -> None:
    """Make each expert's gradient the mean over the data ranks (module doc)."""
    group = ep_mesh["edp"].get_group() if ep_mesh["edp"].size() > 1 else None
    # in the model's order, the same on every rank (a set's order is not: the collectives
    # would pair one rank's w1 with another's w3)
    for param in _in_order(model):
        if param.grad is None:
            continue
        local = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        if group is not None:
            dist.all_reduce(local, group=group)
        local.div_(dp_shard)


class Dispatch:
    """Tokens sorted by expert to the ranks holding their experts, through the local experts,
    and back in the same order (MoE.dispatch)."""

    def __init__(self, group: dist.ProcessGroup, ep: int, local: int) -> None:
        self.group, self.ep, self.local = group, ep, local
        self.me = dist.get_rank(group)
        # The forward's all-to-all bytes this rank sent to other ranks (dispatch and
        # combine; the backward sends as many again), as the planner counts them.
        self.sent_bytes = 0

    def __call__(self, experts: Experts, tokens: torch.Tensor, counts: torch.Tensor
                 ) -> torch.Tensor:
        send = counts.view(self.ep, self.local)  # [to rank, its expert]
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv.view(-1), send.reshape(-1).contiguous(), group=self.group)
        out_splits, in_splits = recv.sum(dim=1).tolist(), send.sum(dim=1).tolist()
        received = all_to_all_single(tokens.new_empty((sum(out_splits), tokens.shape[1])),
                                     tokens, out_splits, in_splits, group=self.group)
        # received: by source rank, then by expert; the experts run expert by expert
        expert_of = torch.arange(self.local, device=tokens.device).repeat(self.ep)
        order = torch.repeat_interleave(expert_of, recv.flatten()).argsort(stable=True)
        done = experts(received[order], recv.sum(dim=0).tolist())
        back = done[order.argsort()]
        away = sum(in_splits) - in_splits[self.me] + sum(out_splits) - out_splits[self.me]
        self.sent_bytes += away * tokens.shape[1] * tokens.element_size()
        return all_to_all_single(tokens.new_empty((sum(in_splits), tokens.shape[1])), back,
                                 in_splits, out_splits, group=self.group)
