"""A mixture-of-experts MLP for the built-in decoder's sparse blocks (GPTConfig.moe), routed as
transformers' Qwen3-MoE, Qwen2-MoE and Mixtral route: softmax scores over the experts, the
top k kept (normalised to sum to 1 where the family does), each token's outputs summed by
those weights; dropless (every token reaches its experts), so a step equals transformers'
forward. A shared expert on every token, gated by a sigmoid of the token where Qwen2-MoE
gates it.

The experts' weights are packed, one tensor per projection over all experts (`w1` gate and
`w3` up [experts, ffn, dim], `w2` down [experts, dim, ffn]), as torchtitan's GroupedExperts
and transformers 5 keep them in memory: FSDP and expert parallelism shard them along the
experts. Tokens are sorted by expert and run as one grouped GEMM (`torch._grouped_mm`) on
CUDA; on CPU, whose grouped GEMM has no backward in torch 2.13, one matmul per expert.
Written here rather than imported from torchtitan (whose `models/common/moe.py` is the
model): torchtitan 0.3.0 pulls datasets, wandb, tyro and a pinned `spmd_types` into the
service's install, its MoE package imports its attention stack, and the families' routing
details (Mixtral's and Qwen's top-k normalisation, Qwen2-MoE's gated shared expert) are
transformers', which the parity tests hold this module to.

Each forward records what balancing needs (`stats`): the softmax probabilities' sum per
expert and the tokens routed to each, from which the model computes the load-balancing loss
as transformers' `load_balancing_loss_func` does, and the busiest expert's load over the
mean.

    moe = MoE(config)            # config.moe set
    out = moe(x)                 # [batch, seq, dim] -> the same
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raytrain.spec.gpt_config import GPTConfig, MoEConfig


class Experts(nn.Module):
    """The routed experts' SwiGLU weights, packed (module doc). `first` is the index of this
    module's first expert among all (expert parallelism holds a slice; 0 otherwise)."""

    def __init__(self, num_experts: int, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, ffn_dim))
        self.total = num_experts  # experts in the block, here or on other ranks
        self.first = 0

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens sorted by expert, `counts[e]` of them for this module's expert e."""
        # FSDP's bf16 parameters do not reach experts it leaves to expert parallelism
        w1, w2, w3 = (_local(w).to(x.dtype) for w in (self.w1, self.w2, self.w3))
        grouped = getattr(torch, "_grouped_mm", None)  # torch's grouped GEMM (private API)
        if x.is_cuda and grouped is not None:
            offsets = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            h = F.silu(grouped(x, w1.transpose(-2, -1), offs=offsets)) * \
                grouped(x, w3.transpose(-2, -1), offs=offsets)
            out: torch.Tensor = grouped(h, w2.transpose(-2, -1), offs=offsets)
            return out
        pieces = []
        for e, chunk in enumerate(x.split(counts)):
            if counts[e]:
                pieces.append(F.linear(F.silu(F.linear(chunk, w1[e])) * F.linear(chunk, w3[e]),
                                       w2[e]))
        return torch.cat(pieces) if pieces else x.new_zeros((0, w2.shape[1]))


def _local(weight: torch.Tensor) -> torch.Tensor:
    """A weight as this rank holds it whole (FSDP gathers it before the forward)."""
    return weight.to_local() if hasattr(weight, "to_local") else weight


class SwiGLU(nn.Module):
    """A dense SwiGLU MLP (the shared expert), named as the dense blocks' FeedForward."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.moe is not None
        moe: MoEConfig = config.moe
        self.moe = moe
        self.router = nn.Linear(config.dim, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, config.dim, moe.expert_ffn_dim)
        self.shared = SwiGLU(config.dim, moe.shared_ffn_dim) if moe.shared_ffn_dim else None
        self.shared_gate = nn.Linear(config.dim, 1, bias=False) if moe.shared_gate else None
        # Set by expert parallelism (raytrain.parallel.experts): how tokens reach the experts
        # other ranks hold. None: every expert is here.
        self.dispatch: object | None = None
        # What the last forward routed (balancing): per expert, the probabilities' sum (with
        # its gradient) and the tokens routed to it; and the tokens seen.
        self.stats: tuple[torch.Tensor, torch.Tensor, int] | None = None
        # DeepSeek-V3's score correction: added to the scores for the choice only, moved after
        # each step by update_bias; and the tokens each expert got since (training forwards).
        if moe.score_bias:
            self.register_buffer("score_bias", torch.zeros(moe.num_experts))
            self.register_buffer("routed_since", torch.zeros(moe.num_experts),
                                 persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        flat = x.reshape(-1, dim)
        weights, chosen, probs = self._route(flat)
        weights = weights.to(x.dtype)
        routed = torch.zeros(self.moe.num_experts, device=x.device, dtype=torch.float32)
        routed.scatter_add_(0, chosen.flatten(), torch.ones(chosen.numel(), device=x.device))
        self.stats = (probs.sum(dim=0), routed, flat.shape[0])
        if self.moe.score_bias and self.training:
            self.routed_since += routed.detach()
        out = self._routed(flat, chosen, weights)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.reshape(batch, seq, dim)

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each token's routing weights and experts (top_k), and the softmax probabilities
        the balancing loss reads: scores by softmax or sigmoid, chosen within the best groups
        (group-limited routing) by the scores plus the correction bias where there is one,
        weighted by the scores, normalised where the family does, times routed_scaling."""
        moe = self.moe
        logits = self.router(flat).float()
        probs = F.softmax(logits, dim=-1)
        scores = probs if moe.scoring == "softmax" else torch.sigmoid(logits)
        choice = scores + self.score_bias if moe.score_bias else scores
        if moe.groups > 1:
            grouped = choice.view(-1, moe.groups, moe.num_experts // moe.groups)
            best = grouped.max(dim=-1).values if moe.group_score == "max" \
                else grouped.topk(2, dim=-1).values.sum(dim=-1)
            kept = torch.zeros_like(best, dtype=torch.bool).scatter_(
                1, best.topk(moe.top_groups, dim=-1).indices, True)
            choice = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).flatten(1)
        chosen = choice.topk(moe.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        if moe.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * moe.routed_scaling, chosen, probs

    @torch.no_grad()
    def update_bias(self, rate: float, routed: torch.Tensor) -> None:
        """DeepSeek-V3's balancing without a loss: each expert's bias up by `rate` if it got
        fewer than the mean of the tokens `routed` (every rank's, since the last update),
        down if more, the changes centred (torchtitan's rule); the count starts again."""
        change = rate * torch.sign(routed.mean() - routed)
        self.score_bias += change - change.mean()
        self.routed_since.zero_()

    def _routed(self, flat: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        """Each token's experts' outputs, summed by its routing weights."""
        order = chosen.flatten().argsort(stable=True)
        token = order // self.moe.top_k  # the token each sorted assignment is of
        counts = torch.bincount(chosen.flatten(), minlength=self.moe.num_experts)
        sorted_in = flat[token]
        if self.dispatch is not None:
            sorted_out = self.dispatch(self.experts, sorted_in, counts)  # type: ignore[operator]
        else:
            sorted_out = self.experts(sorted_in, counts.tolist())
        scaled = sorted_out * weights.flatten()[order].unsqueeze(-1)
        return torch.zeros_like(flat).index_add(0, token, scaled.to(flat.dtype))


def balancing(moes: list[MoE]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The load-balancing loss of the last forward over every sparse block, as transformers'
    `load_balancing_loss_func` computes it (the blocks' routing counted together: each
    expert's share of the top-k assignments times its mean probability, summed, times the
    number of experts), and the busiest expert's tokens over the mean, at the most
    unbalanced block (no gradient). None if no block routed."""
    stats = [m.stats for m in moes if m.stats is not None]
    if not stats:
        return None
    experts = moes[0].moe.num_experts
    prob_sum = torch.stack([s[0] for s in stats]).sum(dim=0)
    routed = torch.stack([s[1] for s in stats])
    rows = sum(s[2] for s in stats)
    loss = experts * torch.sum((routed.sum(dim=0) / rows) * (prob_sum / rows))
    imbalance = (routed.max(dim=1).values / routed.mean(dim=1)).max()
    return loss, imbalance.detach()
