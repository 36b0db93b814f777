"""Multi-head latent attention (DeepSeek-V2 and V3; GPTConfig.mla), as transformers'
DeepseekV3Attention computes it: keys and values expanded from one low-rank latent of the
token (`kv_lora_rank`, normalised) by `wkv_b`, beside one rotary key every head shares;
queries projected directly (`wq`) or through a latent of their own (`wq_a`, normalised,
`wq_b`); each head's query and key a part without positions and a rotary part, rotated in
interleaved pairs; the softmax scaled by the query/key width's inverse square root, times
YaRN's mscale_all_dim squared where the model is scaled so. The names follow the built-in
attention's (`wq`, `wo`), so LoRA targets q_proj and o_proj alike.

    attention = LatentAttention(config)     # config.mla set
    out = attention(x)                      # [batch, seq, dim] -> the same
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raytrain.models.rotary import rotary_tables, rotate, rotate_interleaved, yarn_mscale
from raytrain.spec.gpt_config import GPTConfig

LATENT_NORM_EPS = 1e-6  # transformers' DeepseekV3RMSNorm default, for both latents


class LatentAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.mla is not None
        mla = self.mla = config.mla
        heads, dim = config.num_heads, config.dim
        self.heads = heads
        if mla.q_lora_rank is None:
            self.wq: nn.Linear | None = nn.Linear(dim, heads * mla.qk_head_dim, bias=False)
            self.wq_a = self.q_a_norm = self.wq_b = None
        else:
            self.wq = None
            self.wq_a = nn.Linear(dim, mla.q_lora_rank, bias=False)
            self.q_a_norm = nn.RMSNorm(mla.q_lora_rank, eps=LATENT_NORM_EPS)
            self.wq_b = nn.Linear(mla.q_lora_rank, heads * mla.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(mla.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(mla.kv_lora_rank,
                               heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.wo = nn.Linear(heads * mla.v_head_dim, dim, bias=False)
        self.rope_theta = config.rope_theta
        self.yarn = config.rope_yarn
        self.scale = mla.qk_head_dim ** -0.5
        if self.yarn is not None and self.yarn.mscale_all_dim:
            self.scale *= yarn_mscale(self.yarn.factor, self.yarn.mscale_all_dim) ** 2
        self.selective = False  # recompute the attention core in the backward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        mla = self.mla
        if self.wq is not None:
            q = self.wq(x)
        else:
            assert self.wq_a is not None and self.q_a_norm is not None and self.wq_b is not None
            q = self.wq_b(self.q_a_norm(self.wq_a(x)))
        q = q.view(batch, seq, -1, mla.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = q.split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_rot = self.wkv_a(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        k_rot = k_rot.view(batch, 1, seq, mla.qk_rope_head_dim)
        cos, sin = rotary_tables(seq, mla.qk_rope_head_dim, self.rope_theta, x.device,
                                 yarn=self.yarn)
        turn = rotate_interleaved if mla.rope_interleave else rotate
        q_rot, k_rot = turn(q_rot, cos, sin), turn(k_rot, cos, sin)
        kv = self.wkv_b(self.kv_norm(latent)).view(batch, seq, -1,
                                                    mla.qk_nope_head_dim + mla.v_head_dim)
        k_pass, v = kv.transpose(1, 2).split([mla.qk_nope_head_dim, mla.v_head_dim], dim=-1)
        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_pass, k_rot.expand(-1, k_pass.shape[1], -1, -1)), dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))

