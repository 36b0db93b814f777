"""The built-in GPT-style decoder's dimensions and blocks (GPT or Llama-style), as a job's
model.gpt states them or a Hugging Face config maps onto them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raytrain.spec._base import Strict, field_error, raise_if_any
from raytrain.spec.layout import divisors


class RopeScaling(Strict):
    """Llama 3's rotary scaling: low frequencies divided by `factor`, high ones kept, and a
    smooth blend between (transformers' `_compute_llama3_parameters`)."""

    factor: float = Field(gt=0, le=1e4, description="How much the low frequencies slow.")
    low_freq_factor: float = Field(gt=0, le=1e4, description="Wavelengths above "
                                   "original_max_position_embeddings / this are scaled.")
    high_freq_factor: float = Field(gt=0, le=1e4, description="Wavelengths below "
                                    "original_max_position_embeddings / this are kept.")
    original_max_position_embeddings: int = Field(ge=1, le=4_194_304, description=(
        "The context the model was pretrained at."))


class GPTConfig(Strict):
    """Dimensions of the built-in GPT-style decoder."""

    vocab_size: int = Field(256, ge=2, le=1_000_000, description="Number of token ids.")
    # Upper bounds: several times the largest published dense models (dim 25,600, 128
    # layers), so a typo or a hostile request cannot make validation or the planner spin.
    dim: int = Field(128, ge=8, le=131_072, description="Model (residual stream) width.")
    num_layers: int = Field(2, ge=1, le=2_048, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, le=4_096,
                           description="Attention heads per block; must divide dim.")
    ffn_dim: int | None = Field(
        None, ge=1, le=1_048_576, description="Hidden width of each MLP; default 4 x dim."
    )
    max_seq_len: int = Field(128, ge=2, le=4_194_304,
                             description="Longest sequence the model accepts.")
    # Llama-style blocks (Llama, Mistral, Qwen); the defaults are GPT's.
    num_kv_heads: int | None = Field(
        None, ge=1, le=4_096, description="Key/value heads (grouped-query attention); must "
        "divide num_heads. Default: num_heads (multi-head attention).")
    mlp: Literal["gelu", "swiglu"] = Field(
        "gelu", description="'gelu': w2(gelu(w1 x)); 'swiglu': the gated w2(silu(w1 x) * w3 x) "
        "of Llama (three matrices of ffn_dim).")
    positions: Literal["learned", "rotary"] = Field(
        "learned", description="'learned': a table of max_seq_len positions added to the "
        "token embeddings; 'rotary': rotary embeddings on queries and keys (no table).")
    rope_theta: float = Field(10_000.0, gt=1, le=1e9,
                              description="Rotary embeddings' base (positions 'rotary').")
    tie_embeddings: bool = Field(
        False, description="The output head shares the token embeddings' weights.")
    norm_eps: float | None = Field(
        None, gt=0, le=1e-1, description="The RMSNorms' epsilon (a Hugging Face config's "
        "rms_norm_eps); null: torch's default for the dtype.")
    qkv_bias: bool = Field(
        False, description="Biases on the query, key and value projections (Qwen2).")
    head_dim: int | None = Field(
        None, ge=2, le=4_096, description="Width of each attention head; null: dim / "
        "num_heads. Wider or narrower heads make the query and output projections num_heads "
        "x head_dim rather than dim (Qwen3).")
    qk_norm: bool = Field(
        False, description="An RMSNorm over each head's query and key before the rotary "
        "embedding (Qwen3).")
    rope_scaling: RopeScaling | None = Field(
        None, description="Llama 3's rotary frequency scaling (a config's rope_scaling with "
        "rope_type 'llama3'); null: none.")

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> GPTConfig:
        errors = []
        if self.head_dim is None and self.dim % self.num_heads:
            errors.append(field_error(
                ("num_heads",),
                f"num_heads={self.num_heads} must divide dim={self.dim}. To fix: pick "
                f"num_heads from the divisors of {self.dim}, e.g. "
                f"{_nearest_divisor(self.dim, self.num_heads)}",
                self.num_heads,
            ))
        elif self.positions == "rotary" and self.attention_head_dim % 2:
            errors.append(field_error(
                ("positions",),
                f"rotary positions rotate pairs of each head's {self.attention_head_dim} "
                "values, an odd number. To fix: make the heads' width even, or use positions "
                "'learned'", self.positions))
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            errors.append(field_error(
                ("num_kv_heads",),
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} "
                "(each key/value head serves a group of query heads). To fix: pick one of "
                f"{divisors(self.num_heads)}", self.num_kv_heads))
        raise_if_any("GPTConfig", errors)
        return self

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.dim


def _nearest_divisor(n: int, near: int) -> int:
    return min(divisors(n), key=lambda d: (abs(d - near), d))
