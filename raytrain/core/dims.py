"""What the planner prices, as values: a model's dimensions (ModelDims: its shapes, the
parameters and FLOPs per token they make, the activations a block keeps) and the workload
(Workload: batch, precision, the options searched, the kernels' speeds, what trains). The
cost model (raytrain.core.cost_model) and the planner read them; resolve.py makes them from a
job spec or a Hugging Face config.

    dims = ModelDims(num_layers=32, dim=4096, num_heads=32, ffn_dim=14336, vocab_size=128256,
                     seq_len=8192, num_kv_heads=8, gated_mlp=True)
    dims.params, dims.flops_per_token
"""

from __future__ import annotations

from dataclasses import dataclass

from raytrain.core.kernels import KERNELS, KernelModel
from raytrain.spec.gpt_config import LatentAttention, MoEConfig
from raytrain.spec.layout import ModelShape


@dataclass(frozen=True)
class ModelDims:
    num_layers: int
    dim: int
    num_heads: int
    ffn_dim: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None
    gated_mlp: bool = False
    position_rows: int = 0  # learned position embeddings (the built-in GPT); 0 for RoPE
    tied_embeddings: bool = False  # the head's weight is the embeddings' (counted once)
    built_in: bool = False  # the built-in GPT (its vocabulary and positions shard under tp)
    head_dim: int | None = None  # each head's width; None: dim / num_heads
    qk_norm: bool = False  # a norm over each head's query and key (its scales counted)
    # A mixture of experts (GPTConfig.moe) in `sparse_layers` of the blocks: `experts` SwiGLU
    # experts of expert_ffn_dim, `top_k` of them run per token, beside a shared expert of
    # shared_ffn_dim (0: none); the other blocks' MLPs are dense, of ffn_dim. Memory counts
    # every expert (params); compute the ones a token runs (active_params, mlp_width).
    experts: int = 0
    top_k: int = 0
    expert_ffn_dim: int = 0
    shared_ffn_dim: int = 0
    sparse_layers: int = 0
    # Multi-head latent attention (DeepSeek): one block's attention parameters (its
    # projections and latents' norms), which then replace the grouped-query count; 0: none.
    latent_attention: int = 0

    @staticmethod
    def from_gpt(num_layers: int, dim: int, num_heads: int, ffn_dim: int, vocab_size: int,
                 seq_len: int, max_seq_len: int, num_kv_heads: int | None = None,
                 gated_mlp: bool = False, rotary: bool = False,
                 tied_embeddings: bool = False, head_dim: int | None = None,
                 qk_norm: bool = False, moe: MoEConfig | None = None,
                 mla: LatentAttention | None = None) -> ModelDims:
        """The built-in GPT's dimensions (raytrain.spec.GPTConfig's fields)."""
        experts = {} if moe is None else {
            "experts": moe.num_experts, "top_k": moe.top_k,
            "expert_ffn_dim": moe.expert_ffn_dim, "shared_ffn_dim": moe.shared_ffn_dim,
            "sparse_layers": num_layers - len(moe.dense_layers)}
        return ModelDims(num_layers, dim, num_heads, ffn_dim, vocab_size, seq_len,
                         num_kv_heads, gated_mlp, 0 if rotary else max_seq_len,
                         tied_embeddings, built_in=True, head_dim=head_dim, qk_norm=qk_norm,
                         latent_attention=0 if mla is None else _latent_params(dim, num_heads,
                                                                                mla),
                         **experts)

    def layout_shape(self) -> ModelShape:
        """What the layout check needs of the model. Tensor parallelism shards the built-in
        GPT's vocabulary and learned positions too; other models the planner is given
        (published runs, a user's config) are checked by heads, MLP and layers."""
        built_in = self.built_in
        return ModelShape(num_layers=self.num_layers, num_heads=self.num_heads,
                          hidden_dim=self.ffn_dim, num_kv_heads=self.num_kv_heads,
                          vocab_size=self.vocab_size if built_in else None,
                          max_seq_len=self.position_rows if built_in and self.position_rows
                          else None, tied_embeddings=self.tied_embeddings)

    @property
    def q_dim(self) -> int:
        """The queries' (and the attention output's) width: num_heads x head_dim."""
        return self.dim if self.head_dim is None else self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.q_dim * (self.num_kv_heads or self.num_heads) // self.num_heads

    def _mlp(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.dim * width

    def _block_without_mlp(self) -> int:
        attention = self.latent_attention or 2 * self.dim * self.q_dim + 2 * self.dim * self.kv_dim
        norms = 2 * self.dim + (2 * self.q_dim // self.num_heads if self.qk_norm else 0)
        return attention + norms

    def _mean_mlp(self, routed: int) -> int:
        """A block's MLP parameters, the mean over the blocks, with `routed` experts counted
        in each sparse block (its router and shared expert too)."""
        if not self.sparse_layers:
            return self._mlp(self.ffn_dim)
        sparse = routed * self._mlp(self.expert_ffn_dim) + self._mlp(self.shared_ffn_dim) + \
            self.dim * (self.experts + (1 if self.shared_ffn_dim else 0))
        dense = self.num_layers - self.sparse_layers
        return (dense * self._mlp(self.ffn_dim) + self.sparse_layers * sparse) \
            // self.num_layers

    @property
    def block_params(self) -> int:
        """A block's parameters (the mean over the blocks, every expert counted)."""
        return self._block_without_mlp() + self._mean_mlp(self.experts)

    @property
    def expert_params(self) -> int:
        """The routed experts' parameters, every sparse block's (what expert parallelism
        splits and FSDP then leaves alone)."""
        return self.sparse_layers * self.experts * self._mlp(self.expert_ffn_dim)

    def all_to_all_bytes(self, tokens: int, act_bytes: int, ep: int) -> float:
        """Bytes one rank sends in one all-to-all of a sparse block under expert parallelism
        (`tokens` its micro-batch's): each token's hidden state to each of its top_k
        experts, those held elsewhere ((ep - 1) / ep of them, routing balanced)."""
        return tokens * self.top_k * self.dim * act_bytes * (ep - 1) / ep

    @property
    def active_block_params(self) -> int:
        """The parameters a token's compute goes through in a block: a mixture of experts'
        top_k experts (and shared expert, and router), not all of them."""
        return self._block_without_mlp() + self._mean_mlp(self.top_k)

    @property
    def mlp_width(self) -> float:
        """The MLP hidden width a token goes through, the mean over the blocks (the timing's
        and the activations' width): ffn_dim dense; top_k experts' and the shared expert's
        in a sparse block."""
        if not self.sparse_layers:
            return self.ffn_dim
        dense = self.num_layers - self.sparse_layers
        sparse = self.top_k * self.expert_ffn_dim + self.shared_ffn_dim
        return (dense * self.ffn_dim + self.sparse_layers * sparse) / self.num_layers

    @property
    def embedding_params(self) -> int:
        return (self.vocab_size + self.position_rows) * self.dim

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.dim + self.dim

    @property
    def params(self) -> int:
        shared = self.vocab_size * self.dim if self.tied_embeddings else 0
        return self.num_layers * self.block_params + self.embedding_params + self.head_params \
            - shared

    @property
    def active_params(self) -> int:
        """The parameters a token's forward goes through (all of them for a dense model)."""
        return self.params - self.num_layers * (self.block_params - self.active_block_params)

    @property
    def flops_per_token(self) -> float:
        active = self.num_layers * self.active_block_params + self.head_params  # tied or not
        return 6.0 * active + 12.0 * self.num_layers * self.q_dim * self.seq_len

    @property
    def activation_values_per_token_layer(self) -> int:
        return int(6 * self.dim + 2 * self.q_dim + 2 * self.kv_dim +
                   (3 if self.gated_mlp else 2) * self.mlp_width)

    def saved_values_per_token_layer(self, fused: bool) -> int:
        """Values a block saves for its backward, per token (what memory counts; the timing's
        count above is the work between the matmuls). Eager PyTorch, as raytrain's block runs
        and tests/pure/test_memory.py measures with saved-tensor hooks: each RMSNorm keeps
        its input, its normalised input and its output (3d), q and the attention's output
        (2d), k and v, and the MLP's hidden tensors (SwiGLU: the gate, its SiLU, the up
        projection and their product, 4f; GELU: its input and output, 2f). Fused kernels
        (fused_elementwise: Megatron-LM, Transformer Engine, torch.compile) keep a norm's
        input and output only and a SwiGLU's two inputs and its product: 2d less, f less."""
        mlp = (3 if fused else 4) * self.mlp_width if self.gated_mlp else 2 * self.mlp_width
        # A q/k norm (Qwen3) keeps its input and normalised input too (fused: its input).
        qk = (1 if fused else 2) * (self.q_dim + self.kv_dim) if self.qk_norm else 0
        return int((4 if fused else 6) * self.dim + 2 * self.q_dim + 2 * self.kv_dim + mlp + qk)

    def activation_values_on_rank(self, tp: int, sequence_parallel: bool,
                                  values: float | None = None) -> float:
        """A block's activation values per token on one tensor-parallel rank (`values`: of
        the whole block; default the timing's count): all of them split over the ranks under
        sequence parallelism; without it, the 4*d around the norms whole on every rank."""
        if values is None:
            values = self.activation_values_per_token_layer
        if tp == 1:
            return values
        if sequence_parallel:
            return values / tp
        return (values - 4 * self.dim) / tp + 4 * self.dim


def _latent_params(dim: int, heads: int, mla: LatentAttention) -> int:
    """A latent attention block's parameters: the queries' projection (direct, or through
    their latent and its norm), the keys' and values' latent with the shared rotary key, its
    norm, its expansion to every head, and the output."""
    qk, q_lora, kv_lora = mla.qk_head_dim, mla.q_lora_rank, mla.kv_lora_rank
    query = dim * heads * qk if q_lora is None else dim * q_lora + q_lora + q_lora * heads * qk
    return query + dim * (kv_lora + mla.qk_rope_head_dim) + kv_lora + \
        kv_lora * heads * (mla.qk_nope_head_dim + mla.v_head_dim) + heads * mla.v_head_dim * dim


@dataclass(frozen=True)
class Workload:
    global_batch: int  # sequences per optimizer step
    precision: str = "bf16"  # compute precision: bf16 | fp32 | fp8 (bf16, float8 linears)
    recompute_options: tuple[str, ...] = ("none", "full")
    micro_batch_options: tuple[int, ...] = (1, 2, 4, 8, 16)
    loss_parallel: bool = False  # logits sharded over tp for the loss (torchtitan: yes)
    max_tp: int = 16
    attention: str = "flash"  # flash (scaled_dot_product_attention) | unfused
    fused_elementwise: bool = False  # norms, activations fused (torch.compile, Megatron)
    grad_reduce_bytes: int = 4  # bytes per gradient value data parallelism all-reduces
    # Bytes per activation value in tensor parallelism's all-gathers (None: act_bytes).
    # Float8 linears gather their input in float8 (1 byte; torchao's Float8Linear under TP,
    # torchtitan's default); the reduce-scatters of their outputs stay in act_bytes.
    tp_gather_bytes: float | None = None
    data_parallel_only: bool = False  # a model of the user's own: DDP or FSDP, no tp or pp
    # Sequence parallelism's linears save their input's shard and all-gather it again for
    # the backward (Megatron-LM's way: less memory, one more all-gather per input); False:
    # PyTorch's (raytrain's), which saves the gathered input whole.
    sp_regather: bool = False
    kernels: KernelModel = KERNELS  # how fast kernels run (raytrain.core.kernels, fitted)
    # The parameters that train (LoRA: its adapters' share of the model's); the others
    # keep their weights only: no gradients, no optimizer state.
    trainable_share: float = 1.0
    frozen_param_bytes: int = 4  # a frozen weight's bytes (LoRA under bf16 keeps them in it)
    # raytrain's built-in model computes the loss a chunk of tokens at a time (no tensor or
    # pipeline parallelism): its logits never whole (cost_model.LOSS_CHUNK_BYTES)
    chunked_loss: bool = False

    @property
    def frozen_weights(self) -> bool:
        """LoRA: the linears' own weights take no gradient (their adapters' small matmuls,
        rank r against the layer's width, are not counted)."""
        return self.trainable_share < 1

    @property
    def act_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2
