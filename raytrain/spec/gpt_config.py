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


class YarnScaling(Strict):
    """YaRN's rotary scaling (DeepSeek's `rope_type: yarn`), as transformers computes it
    (`_compute_yarn_parameters`): frequencies interpolated by `factor` below a ramp between
    beta_fast and beta_slow rotations, cos and sin scaled by the attention factor, and the
    softmax's scale by mscale_all_dim's square."""

    factor: float = Field(gt=0, le=1e4, description="How much the context was stretched.")
    original_max_position_embeddings: int = Field(ge=1, le=4_194_304, description=(
        "The context the model was pretrained at."))
    beta_fast: float = Field(32.0, gt=0, le=1e4, description="The ramp's fast end (rotations).")
    beta_slow: float = Field(1.0, gt=0, le=1e4, description="The ramp's slow end (rotations).")
    mscale: float = Field(0.0, ge=0, le=1e3, description="YaRN's mscale (0: from factor).")
    mscale_all_dim: float = Field(0.0, ge=0, le=1e3, description=(
        "The mscale of every dimension (0: none): the softmax scale times its square."))
    truncate: bool = Field(True, description="Round the ramp's ends to whole dimensions.")


class LatentAttention(Strict):
    """Multi-head latent attention (DeepSeek-V2 and V3): keys and values from a low-rank latent
    (`kv_lora_rank`) shared by the heads plus one rotary key, queries direct or through their
    own latent (`q_lora_rank`), each head's query and key split into a part without positions
    and a rotary part (rotated in interleaved pairs)."""

    q_lora_rank: int | None = Field(None, ge=1, le=65_536, description=(
        "The queries' latent width; null: queries projected directly."))
    kv_lora_rank: int = Field(ge=1, le=65_536, description="The keys' and values' latent width.")
    qk_nope_head_dim: int = Field(ge=1, le=4_096, description="A head's query/key width "
                                  "without positions.")
    qk_rope_head_dim: int = Field(ge=2, le=4_096, description="A head's rotary query/key width.")
    v_head_dim: int = Field(ge=1, le=4_096, description="A head's value width.")
    rope_interleave: bool = Field(True, description=(
        "The rotary part rotated in interleaved pairs (DeepSeek's layout); false: in halves."))

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MoEConfig(Strict):
    """A mixture of experts in place of the MLP of every sparse block: a router scores the
    experts for each token, the top `top_k` run (SwiGLU MLPs of `expert_ffn_dim`), and their
    outputs are summed by the routing weights; beside them an optional shared expert runs on
    every token. As Qwen3-MoE, Qwen2-MoE and Mixtral define it (raytrain.models.moe)."""

    num_experts: int = Field(ge=2, le=4_096, description="Routed experts per sparse block.")
    top_k: int = Field(ge=1, le=64, description="Experts each token is routed to.")
    expert_ffn_dim: int = Field(ge=1, le=1_048_576, description="Each expert's hidden width.")
    norm_topk: bool = Field(True, description=(
        "Normalise the top-k routing weights to sum to 1 (Mixtral always; Qwen's "
        "norm_topk_prob)."))
    shared_ffn_dim: int = Field(0, ge=0, le=1_048_576, description=(
        "Hidden width of a shared expert every token goes through (Qwen2-MoE); 0: none."))
    shared_gate: bool = Field(False, description=(
        "The shared expert's output scaled by sigmoid(a learned gate of the token) "
        "(Qwen2-MoE's shared_expert_gate)."))
    dense_layers: list[int] = Field(default_factory=list, max_length=2_048, description=(
        "Blocks with a dense MLP of ffn_dim instead (Qwen's mlp_only_layers and "
        "decoder_sparse_step)."))
    scoring: Literal["softmax", "sigmoid"] = Field("softmax", description=(
        "The router's scores: a softmax over the experts (Qwen, Mixtral, DeepSeek-V2) or each "
        "expert's sigmoid (DeepSeek-V3)."))
    groups: int = Field(1, ge=1, le=4_096, description=(
        "Group-limited routing (DeepSeek's n_group): the experts in this many groups, a token "
        "routed within its `top_groups` best groups only; 1: none."))
    top_groups: int = Field(1, ge=1, le=4_096, description="Groups a token may use (topk_group).")
    group_score: Literal["max", "top2"] = Field("max", description=(
        "A group's score: its best expert's (DeepSeek-V2) or its best two's sum (V3)."))
    routed_scaling: float = Field(1.0, gt=0, le=1e3, description=(
        "The routing weights' multiplier (DeepSeek's routed_scaling_factor)."))
    score_bias: bool = Field(False, description=(
        "A per-expert bias added to the scores for the choice only (DeepSeek-V3's "
        "e_score_correction_bias), moved after each step towards balance "
        "(training.moe.bias_update_rate)."))
    aux_loss_coef: float = Field(0.0, ge=0, le=1e3, description=(
        "The router's load-balancing loss (Switch Transformer's, as transformers computes "
        "it) times this is added to the objective (a config's router_aux_loss_coef); the "
        "reported loss stays the language model's."))

    @property
    def active_share(self) -> float:
        """The routed experts' share that runs for a token."""
        return self.top_k / self.num_experts


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
    mla: LatentAttention | None = Field(
        None, description="Multi-head latent attention (DeepSeek) in place of grouped-query "
        "attention; null: the latter.")
    rope_yarn: YarnScaling | None = Field(
        None, description="YaRN's rotary scaling (a config's rope_type 'yarn'); null: none.")
    moe: MoEConfig | None = Field(
        None, description="A mixture of experts in the sparse blocks (mlp 'swiglu'); null: "
        "every block's MLP is dense.")
    unread_layers: int = Field(0, ge=0, le=64, description=(
        "Layers a Hugging Face checkpoint holds beyond the model's blocks, which are not read "
        "or trained (DeepSeek-V3's multi-token prediction layers, num_nextn_predict_layers); "
        "the job's status says so."))

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
        if self.moe is not None and self.moe.top_k > self.moe.num_experts:
            errors.append(field_error(
                ("moe", "top_k"), f"top_k={self.moe.top_k} routes each token to more experts "
                f"than the {self.moe.num_experts} there are. To fix: at most num_experts",
                self.moe.top_k))
        if self.moe is not None and self.mlp != "swiglu":
            errors.append(field_error(
                ("mlp",), "the experts are SwiGLU MLPs. To fix: mlp 'swiglu'", self.mlp))
        if self.moe is not None and any(i >= self.num_layers for i in self.moe.dense_layers):
            errors.append(field_error(
                ("moe", "dense_layers"), f"{self.moe.dense_layers} names blocks past the "
                f"model's {self.num_layers}. To fix: indices from 0 to {self.num_layers - 1}",
                self.moe.dense_layers))
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

    def sparse(self, layer: int) -> bool:
        """Whether block `layer` holds the mixture of experts (else a dense MLP)."""
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.dim


def _nearest_divisor(n: int, near: int) -> int:
    return min(divisors(n), key=lambda d: (abs(d - near), d))
