"""The built-in GPT-style decoder, written for the parallel techniques that will cut it.

Shape follows torchtitan's Llama: separate `wq/wk/wv/wo` and `w1/w2` linears (column/row
tensor parallel apply to them by name), blocks kept in a `ModuleDict` keyed by layer index
(a pipeline stage deletes the blocks it does not own and the remaining names stay those of
the whole model, so checkpoints line up), and every top-level part optional in `forward`
(a stage without the embedding takes hidden states in; one without the head returns them).
Attention reshapes with -1 heads, so it runs unchanged on a tensor-parallel shard of heads.
GPT-2's choices are the defaults; Llama's are options (GPTConfig): grouped-query attention
(`num_kv_heads`), the SwiGLU MLP (`mlp`, a third matrix `w3`), rotary positions
(`positions`) and tied embeddings (`tie_embeddings`). The norms are RMSNorm in both. A
mixture of experts (`moe`, raytrain.models.moe) takes the MLP's place in the sparse blocks.

Initial weights depend only on the seed and each parameter's name (`init_weights`), not on
which other parameters a rank holds or in what order they are created. So a pipeline stage,
a tensor-parallel shard or an FSDP shard, built on the meta device and materialised by itself,
starts from exactly the weights a single process would have.

    model = GPT(GPTConfig(dim=128, num_layers=2, num_heads=4))
    logits = model(tokens)            # [batch, seq] int64 -> [batch, seq, vocab]
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils.checkpoint import checkpoint

from raytrain.models.mla import LatentAttention
from raytrain.models.moe import MoE
from raytrain.models.rotary import rotary_tables, rotate
from raytrain.spec import GPTConfig


class Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.head_dim = config.attention_head_dim
        q_dim, kv_dim = config.num_heads * self.head_dim, config.kv_heads * self.head_dim
        self.wq = nn.Linear(config.dim, q_dim, bias=config.qkv_bias)
        self.wk = nn.Linear(config.dim, kv_dim, bias=config.qkv_bias)
        self.wv = nn.Linear(config.dim, kv_dim, bias=config.qkv_bias)
        self.wo = nn.Linear(q_dim, config.dim, bias=False)
        # Qwen3: each head's query and key normalised (one scale per head width, shared by
        # the heads, so a tensor-parallel rank's share of the heads uses it whole).
        self.q_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm \
            else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm \
            else None
        self.rope_theta = config.rope_theta if config.positions == "rotary" else None
        self.rope_scaling = config.rope_scaling
        self.selective = False  # recompute the attention core (scores) in the backward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds only its share of the heads
        # (of the query heads and of the key/value heads alike, so the groups stay whole).
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.rope_theta is not None:
            cos, sin = rotary_tables(seq, self.head_dim, self.rope_theta, x.device,
                                     self.rope_scaling)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.selective and torch.is_grad_enabled():
            out = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            out = _attention_core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=q.shape[1] != k.shape[1])


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.w2 = nn.Linear(config.hidden_dim, config.dim, bias=False)
        # SwiGLU's gate (Shazeer 2020), as Llama's w3
        self.w3 = nn.Linear(config.dim, config.hidden_dim, bias=False) \
            if config.mlp == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention: nn.Module = LatentAttention(config) if config.mla is not None \
            else Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward: nn.Module = MoE(config) if config.sparse(layer) \
            else FeedForward(config)

        self.recompute = False  # activation checkpointing: recompute in the backward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(config.max_seq_len, config.dim) \
            if config.positions == "learned" else None
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(config, i) for i in range(config.num_layers)}
        )
        self.norm: nn.RMSNorm | None = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output: nn.Linear | None = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.seed = seed
        self.loss_chunk_tokens: int | None = None  # None: LOSS_CHUNK_BYTES of fp32 logits
        if self.output.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 initialisation; residual projections scaled by depth. Safe after to_empty().

        Each parameter is drawn from its own generator, seeded by the model seed and the
        parameter's name, on the CPU; a sharded parameter (DTensor) keeps its own slice.
        """
        self.tie_weights()
        residual_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, param in self.named_parameters():
            if param.dim() < 2:  # norms' scales 1, biases 0
                param.fill_(0.0 if name.endswith(".bias") else 1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight", "experts.w2")) \
                else 0.02
            generator = torch.Generator().manual_seed(
                zlib.crc32(f"{self.seed}:{name}".encode())
            )
            full = torch.normal(0.0, std, size=tuple(param.shape), generator=generator)
            _copy_into(param, full)

    def experts(self) -> list[MoE]:
        """This model's (or stage's) mixtures of experts, block by block."""
        return [m for m in self.modules() if isinstance(m, MoE)]

    def tie_weights(self) -> None:
        """The head's weight is the token embeddings' (tie_embeddings), again after
        anything that replaced either parameter (`to_empty` from the meta device, tensor
        parallelism's sharding of each)."""
        if self.config.tie_embeddings and self.output is not None and \
                self.tok_embeddings is not None and \
                self.output.weight is not self.tok_embeddings.weight:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The logits [batch, seq, vocab]; with `targets`, the mean next-token loss instead,
        computed a chunk of tokens at a time so that the logits never exist whole
        (chunked_cross_entropy)."""
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                positions = torch.arange(tokens.shape[1], device=tokens.device)
                h = h + self.pos_embeddings(positions)
        else:
            h = tokens
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if targets is not None and self.output is not None:
            chunk = self.loss_chunk_tokens or max(
                1, LOSS_CHUNK_BYTES // (4 * self.output.weight.shape[0]))
            return chunked_cross_entropy(h, self.output.weight, targets, chunk)
        return self.output(h) if self.output is not None else h


# The fp32 logits one chunk of the loss holds (and its gradient, in the backward): 256 MiB.
LOSS_CHUNK_BYTES = 256 * 2**20


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_tokens: int) -> torch.Tensor:
    """The mean cross-entropy of the head `weight` over `hidden` [batch, seq, dim] against
    `targets`, `chunk_tokens` tokens at a time, each chunk's logits recomputed in the backward
    (activation checkpointing), so that at most one chunk's fp32 logits exist at once: for a
    50k vocabulary at 26 x 2,048 tokens, 256 MiB instead of over 10 GB. The same value and
    gradients as the whole logits' cross-entropy, to fp32 rounding."""
    flat, wanted = hidden.flatten(0, 1), targets.flatten()
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, wanted.numel(), chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        total = total + checkpoint(_chunk_loss, flat[piece], weight, wanted[piece],
                                   use_reentrant=False)
    return total / wanted.numel()


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
                ) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")


def _copy_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor `full` into `param`, or into its local slice if it is sharded."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            full.shape, param.device_mesh, param.placements
        )
        index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        param.to_local().copy_(full[index])
    else:
        param.copy_(full)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
