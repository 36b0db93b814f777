"""The model section of a job spec: the built-in GPT's dimensions and blocks (GPT or
Llama-style), or a user's own model by import path, with the shape the planner prices it at.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from raytrain.spec._base import Strict, factory_errors, field_error, raise_if_any, unused_fields
from raytrain.spec.layout import divisors


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

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> GPTConfig:
        errors = []
        if self.dim % self.num_heads:
            errors.append(field_error(
                ("num_heads",),
                f"num_heads={self.num_heads} must divide dim={self.dim}. To fix: pick "
                f"num_heads from the divisors of {self.dim}, e.g. "
                f"{_nearest_divisor(self.dim, self.num_heads)}",
                self.num_heads,
            ))
        elif self.positions == "rotary" and (self.dim // self.num_heads) % 2:
            errors.append(field_error(
                ("positions",),
                f"rotary positions rotate pairs of each head's {self.dim // self.num_heads} "
                "values, an odd number. To fix: make dim / num_heads even, or use positions "
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
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.dim


def _nearest_divisor(n: int, near: int) -> int:
    return min(divisors(n), key=lambda d: (abs(d - near), d))


class ModelSpec(Strict):
    """Which model to train: the built-in GPT, or the user's own by import path."""

    kind: Literal["gpt", "import"] = Field(
        "gpt", description="'gpt' for the built-in decoder, 'import' for a user factory."
    )
    gpt: GPTConfig = Field(default_factory=GPTConfig, description="Built-in GPT dimensions.")
    factory: str | None = Field(
        None,
        max_length=256,
        description="For kind 'import': 'package.module:callable' returning an nn.Module that "
        "maps int64 tokens [batch, seq] to logits [batch, seq, vocab], returned as a tensor, "
        "a tuple whose first item is the logits, or an object with `.logits` (as Hugging "
        "Face models return). The factory is called with model.options as keyword arguments "
        "after torch.manual_seed(training.seed). Only packages the operator allows (service "
        "config allowed_import_packages) are accepted.",
    )
    block_class: str | None = Field(
        None, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="For kind 'import' under FSDP: the class name of the model's repeated "
        "block (LlamaDecoderLayer for a Hugging Face Llama), each sharded as one FSDP unit, "
        "as transformer_layer_cls_to_wrap does elsewhere. null: the largest list of "
        "same-class modules (model.layers, model.model.layers, transformer.h); the job's "
        "status says which units were made (progress.fsdp_units).")
    options: dict[str, Any] = Field(
        default_factory=dict, max_length=64,
        description="Keyword arguments passed to the factory (at most 64; the whole request "
        "body is limited to 1 MiB)."
    )
    shape: GPTConfig | None = Field(
        None, description="For kind 'import': the model's dimensions in model.gpt's terms "
        "(`raytrain plan --model-config` reads them from a Hugging Face config.json), so "
        "strategy 'auto' plans its data-parallel layout (DDP or FSDP, by memory) and the "
        "policy prices it; null: planned as data parallel over the workers, priced by an "
        "assumed speed.")

    @model_validator(mode="after")
    def _factory_matches_kind(self) -> ModelSpec:
        errors = factory_errors(self.kind == "import", self.factory)
        unused = ("factory", "options", "shape", "block_class") if self.kind == "gpt" \
            else ("gpt",)
        errors += unused_fields(self, unused, "model.kind")
        raise_if_any("ModelSpec", errors)
        return self

    @property
    def planned_shape(self) -> GPTConfig | None:
        """The dimensions the planner prices: the built-in GPT's, or an imported model's
        stated shape (None: not known)."""
        return self.gpt if self.kind == "gpt" else self.shape
