"""Rotary position embeddings as transformers applies them: the angles of each position (with
Llama 3's frequency scaling, or YaRN's with its attention factor), and the rotation of
queries and keys, in halves (rotate_half: Llama, Qwen, Mistral) or in interleaved pairs
(DeepSeek).

    cos, sin = rotary_tables(seq, head_dim, theta, device)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
"""

from __future__ import annotations

import math

import torch

from raytrain.spec.gpt_config import RopeScaling, YarnScaling


def rotary_tables(seq: int, head_dim: int, theta: float, device: torch.device,
                  scaling: RopeScaling | None = None, yarn: YarnScaling | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, [seq, head_dim] (each half repeated): the
    rotary embedding of Su et al. as Hugging Face's Llama applies it (rotate_half), with
    Llama 3's frequency scaling or YaRN's (its attention factor on both) when given."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                            device=device) / head_dim)
    factor = 1.0
    if scaling is not None:
        inv_freq = _llama3_scaled(inv_freq, scaling)
    if yarn is not None:
        inv_freq, factor = yarn_frequencies(inv_freq, head_dim, theta, yarn)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos() * factor, angles.sin() * factor


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's mscale (Eq. 21 of the paper): 0.1 * mscale * ln(scale) + 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_frequencies(inv_freq: torch.Tensor, dim: int, theta: float, yarn: YarnScaling
                     ) -> tuple[torch.Tensor, float]:
    """YaRN's frequencies and attention factor, as transformers' `_compute_yarn_parameters`
    computes them: extrapolated (kept) above the ramp, interpolated (divided by factor)
    below it, blended along it."""
    factor = yarn.factor
    attention = yarn_mscale(factor, yarn.mscale) / yarn_mscale(factor, yarn.mscale_all_dim) \
        if yarn.mscale and yarn.mscale_all_dim else yarn_mscale(factor)

    def correction(rotations: float) -> float:
        return dim * math.log(yarn.original_max_position_embeddings /
                              (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(yarn.beta_fast), correction(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=inv_freq.device) - low)
            / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return inv_freq / factor * (1 - keep) + inv_freq * keep, attention


def _llama3_scaled(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3's scaling of the rotary frequencies, as transformers computes it
    (`_compute_llama3_parameters`): long wavelengths slowed by `factor`, short ones kept,
    and those between blended."""
    original = scaling.original_max_position_embeddings
    low_wavelen = original / scaling.low_freq_factor
    high_wavelen = original / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (original / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(between, blended, scaled)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim] rotated by each position's angles."""
    first, second = x.chunk(2, dim=-1)
    turned = torch.cat((-second, first), dim=-1)
    return (x * cos + turned * sin).to(x.dtype)


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, dim] rotated in interleaved pairs (x0, x1), (x2, x3), ... by the
    pairs' angles (the tables' first half), the results laid out evens then odds, as
    transformers' `apply_rotary_pos_emb_interleave` lays them (DeepSeek-V2's complex rotation
    keeps the pairs: the same scores, the dimensions of q and k permuted alike)."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * c - odd * s, odd * c + even * s), dim=-1).to(x.dtype)
