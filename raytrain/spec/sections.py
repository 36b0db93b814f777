"""The sections of a job spec that say what is trained and how (data, training, parallel; the
model's is raytrain.spec.model, what it runs on raytrain.spec.resources): each validates
itself; what must agree across sections is raytrain.spec.job.JobSpec's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from raytrain.catalog.hardware import fp8_kinds
from raytrain.spec._base import (
    Strict,
    factory_errors,
    field_error,
    raise_if_any,
    unused_fields,
)
from raytrain.spec.lora import LoraSpec


class ValidationSpec(Strict):
    """Where the validation loss is measured: a held-out share of the training data, or a
    source of its own."""

    fraction: float | None = Field(None, gt=0, le=0.5, description=(
        "Hold out this share of the training data's windows (the last ones of a token file "
        "or its shards; for synthetic data, samples training never draws), never trained on."))
    path: str | None = Field(None, max_length=4096, description=(
        "A token file or a folder of shards of its own, read in order (data.dtype applies)."))

    @model_validator(mode="after")
    def _one_source(self) -> ValidationSpec:
        if (self.fraction is None) == (self.path is None):
            raise_if_any("ValidationSpec", [field_error(
                ("fraction",), "give one of fraction (a held-out share) or path (a source of "
                "its own)", self.fraction)])
        return self


class DataSpec(Strict):
    """Where training tokens come from. Every data-parallel rank reads its own shard."""

    kind: Literal["synthetic", "token_file", "import"] = Field(
        "synthetic",
        description="'synthetic': seeded learnable token sequences; 'token_file': a flat "
        "binary file of token ids (memory-mapped); 'import': a user factory.",
    )
    seq_len: int = Field(64, ge=1, le=4_194_304, description="Tokens per training sequence.")
    seed: int = Field(0, ge=0, description="Seed of the synthetic data, and of the order of "
                      "a token file's windows with shuffle.")
    validation: ValidationSpec | None = Field(None, description=(
        "A validation loss every training.eval_every_steps (and at the end), in the job's "
        "status, events and /metrics; null: none."))
    shuffle: bool = Field(False, description=(
        "For 'token_file': read the windows in a seeded order, a new one each epoch (sample i "
        "is window shuffled(i mod n) of epoch i // n: docs, What a step does), the same on "
        "any rank count and across resumes. false: in file order."))
    path: str | None = Field(None, max_length=4096,
                             description="For 'token_file': a token file, or a folder of "
                             "shards with their index (`raytrain data prepare`), on storage "
                             "every worker reads, or such a folder in a bucket "
                             "(s3://BUCKET/PREFIX, read with the service's storage settings).")
    dtype: Literal["uint16", "uint32"] = Field(
        "uint16", description="For 'token_file': integer type of the stored token ids."
    )
    factory: str | None = Field(
        None,
        max_length=256,
        description="For kind 'import': 'package.module:callable' returning a map-style dataset "
        "whose items are int64 tensors of seq_len + 1 tokens.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, max_length=64,
        description="Keyword arguments passed to the factory (at most 64; the whole request "
        "body is limited to 1 MiB)."
    )

    @model_validator(mode="after")
    def _source_is_complete(self) -> DataSpec:
        errors = factory_errors(self.kind == "import", self.factory)
        if self.shuffle and self.kind != "token_file":
            errors.append(field_error(("shuffle",), "shuffle orders a token file's windows; "
                                      f"{self.kind!r} data has no file order. To fix: remove "
                                      "data.shuffle", self.shuffle))
        if self.kind == "token_file" and not self.path:
            errors.append(
                field_error(
                    ("path",),
                    "data.kind 'token_file' needs a path. To fix: set data.path to a flat "
                    "binary file of token ids",
                    self.path,
                )
            )
        unused = {"synthetic": ("path", "dtype", "factory", "options"),
                  "token_file": ("seed", "factory", "options"),
                  "import": ("path", "dtype", "seed")}[self.kind]
        errors += unused_fields(self, unused, "data.kind")
        raise_if_any("DataSpec", errors)
        return self


class MoETraining(Strict):
    """Balancing a mixture of experts' routing."""

    aux_loss_coef: float | None = Field(None, ge=0, le=1e3, description=(
        "The weight of the router's load-balancing loss in the objective; null: the model's "
        "own (its config's router_aux_loss_coef); 0: none. The loss reported stays the "
        "language model's; the balancing loss is kept beside it."))
    bias_update_rate: float | None = Field(None, ge=0, le=1.0, description=(
        "DeepSeek-V3's balancing without a loss: after each step every expert's score "
        "correction bias moves by this towards balance (up if it got fewer tokens than the "
        "mean, down if more); null: DeepSeek-V3's 0.001; 0: the bias stays as loaded."))


class TrainingSpec(Strict):
    """The optimisation: steps, batch, AdamW with linear warmup and cosine decay, checkpoints."""

    steps: int = Field(100, ge=1, le=100_000_000, description="Optimizer steps to run.")
    global_batch_size: int = Field(
        16, ge=1, le=100_000_000,
        description="Sequences per optimizer step, summed over all data-parallel ranks."
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        le=1_000_000,
        description="Sequences per rank per forward/backward; the rest of the global batch "
        "is reached by gradient accumulation.",
    )
    learning_rate: float = Field(3e-3, gt=0, le=10, description="Peak learning rate.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final learning rate as a fraction of the peak."
    )
    warmup_steps: int | None = Field(
        None, ge=0, description="Steps of linear warmup W: step s (from 0) uses the peak "
        "times (s + 1) / W, so the first step already moves; default 10% of steps (docs: "
        "What a step does)."
    )
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay on matrices.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    grad_clip_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this; null to disable."
    )
    seed: int = Field(0, ge=0, description="Seed of the model's initial weights.")
    eval_every_steps: int | None = Field(None, ge=1, le=100_000_000, description=(
        "With data.validation: measure the validation loss every this many steps and at the "
        "end; null: every checkpoint_every_steps."))
    eval_batches: int = Field(4, ge=1, le=10_000, description=(
        "With data.validation: global batches (of global_batch_size sequences) the "
        "validation loss is the mean over."))
    checkpoint_every_steps: int = Field(
        50, ge=1, description="Save a checkpoint at least every this many steps (and at the "
        "end); on spot capacity the service also checkpoints at its policy's interval."
    )
    resume_from: str | None = Field(
        None, max_length=4096, description="A checkpoint directory to start from while the "
        "job has none of its own: an ended job's checkpoint.path (POST "
        "/v1/jobs/{id}/resume sets it), on storage every node mounts. The service keeps that "
        "job from being deleted until this one has a checkpoint of its own.",
    )
    keep_checkpoints: int = Field(
        2, ge=1, le=1000, description="Committed checkpoints kept on storage; older ones are "
        "deleted as new ones commit. `raytrain delete ID` removes the rest once the job ended."
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Restarts from the latest checkpoint after a worker "
        "failure."
    )
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        "fp32",
        description="Compute precision. 'bf16' computes in bfloat16 (FSDP2's bf16 parameters "
        "on FSDP layouts and on one device, autocast otherwise) with fp32 weights, gradients "
        "and optimizer; 'fp16' adds dynamic loss scaling and needs GPUs; 'fp8' is bf16 with the "
        "model's linear layers' matmuls in float8 (torchao's Float8Linear, dynamic scaling; "
        "not the output head), on GPUs with FP8 tensor cores (" + ", ".join(fp8_kinds())
        + ") and emulated, "
        "slower, on CPU, to try a job before it runs on GPUs. fp32 suits CPUs.",
    )
    compile: bool | None = Field(
        None,
        description="torch.compile each transformer block (after activation checkpointing, "
        "before FSDP, as torchtitan applies it): fused kernels, a faster step after a warm-up "
        "of tens of seconds, which a job's status reports apart (progress.warmup_s) and leaves "
        "out of its step time and ETA. Default: on for GPU jobs, off on CPU, where compiling "
        "costs more than it saves for a short job.",
    )
    lora: LoraSpec | None = Field(
        None, description="Train low-rank adapters (LoRA, as PEFT defines them) with every "
        "other weight frozen: far less memory (no gradients or optimizer state for the base "
        "weights), under data parallelism or FSDP; the job ends with the adapter as a PEFT "
        "folder (`raytrain export --merge`: merged into the weights). Null: every weight "
        "trains.")
    moe: MoETraining | None = Field(
        None, description="How a mixture of experts is balanced (null: as its family "
        "balances it).")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none",
        description="Scale learning_rate with the global batch: 'linear' multiplies it by "
        "global_batch_size / lr_reference_batch_size, 'sqrt' by the square root of that. "
        "Warmup applies to the scaled rate.",
    )
    lr_reference_batch_size: int | None = Field(
        None,
        ge=1,
        description="The global batch size learning_rate was tuned for; needed by lr_scaling.",
    )

    @model_validator(mode="after")
    def _warmup_fits(self) -> TrainingSpec:
        errors = []
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            errors.append(field_error(
                ("warmup_steps",),
                f"warmup_steps={self.warmup_steps} exceeds steps={self.steps}. To fix: "
                "lower warmup_steps or raise steps",
                self.warmup_steps,
            ))
        if self.lr_scaling != "none" and self.lr_reference_batch_size is None:
            errors.append(field_error(
                ("lr_reference_batch_size",),
                f"lr_scaling '{self.lr_scaling}' scales from the batch size learning_rate "
                "was tuned for. To fix: set lr_reference_batch_size to that batch size",
                None,
            ))
        raise_if_any("TrainingSpec", errors)
        return self

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else self.steps // 10


class ParallelSpec(Strict):
    """How the model is spread over the workers: one DeviceMesh of four degrees whose product
    is resources.num_workers. The strategy names the degree left out to fill the rest."""

    strategy: Literal["data", "fsdp", "expert", "tensor", "pipeline", "hybrid", "auto"] = Field(
        "data",
        description="'data': whole model per worker (DDP); 'fsdp': weights, gradients and "
        "optimizer state sharded (FSDP2); 'tensor': each layer split over workers; "
        "'pipeline': layers split into stages; 'hybrid': every degree given explicitly; "
        "'expert': a mixture of experts fully sharded, its experts split over every data "
        "rank (ep = dp_shard); "
        "'auto': the planner's fastest layout that fits (built-in GPT). The strategy's own "
        "degree defaults to num_workers over the others.",
    )
    dp_replicate: int | None = Field(
        None, ge=1, le=100_000,
        description="Data-parallel replicas (DDP, or HSDP's replicate dimension)."
    )
    dp_shard: int | None = Field(
        None, ge=1, le=100_000, description="Ranks each replica's weights are sharded over (FSDP2)."
    )
    tp: int | None = Field(None, ge=1, le=100_000, description="Tensor-parallel degree.")
    ep: int | None = Field(None, ge=1, le=100_000, description=(
        "Expert parallelism for a mixture of experts: its experts split over this many of "
        "the fully sharded data ranks (it must divide dp_shard and the experts), tokens "
        "exchanged by all-to-all; the other weights stay fully sharded. Default: dp_shard "
        "with strategy 'expert', else 1."))
    pp: int | None = Field(None, ge=1, le=100_000, description="Pipeline-parallel ranks.")
    virtual_stages: int = Field(
        1, ge=1, le=1_024, description="Pipeline stages per pipeline rank (interleaved_1f1b only)."
    )
    pipeline_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b",
        description="Pipeline schedule. The microbatch count is the gradient-accumulation "
        "count: global_batch_size / (micro_batch_size x data-parallel ranks).",
    )
    sequence_parallel: bool = Field(
        True, description="With tp > 1, also split norms and residuals along the sequence."
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each block's activations in the backward pass (the "
        "same as recompute 'full')."
    )
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="The dtype data parallelism reduces gradients in: fp32 (exact), "
        "or bf16 (half the traffic, at bf16's precision): FSDP2's reduce_dtype, or DDP's bf16 "
        "compression hook. The planner prices the traffic it sends.")
    recompute: Literal["none", "selective", "full"] | None = Field(
        None, description="Activation recomputation in the backward pass: 'full' recomputes "
        "each block from its input, 'selective' only the attention core (its scores, the "
        "largest activations for the least compute); default 'full' with "
        "activation_checkpointing, else 'none'."
    )
    reduce_scatter_once: bool = Field(
        False, description="FSDP2 without a pipeline, with several micro-batches per step: "
        "reduce-scatter gradients once per step instead of after each micro-batch, holding "
        "unsharded fp32 gradients in between (fewer collectives, more memory). Strategy "
        "'auto' decides it by speed and memory.",
    )
    zero2: bool = Field(
        False, description="FSDP2 without a pipeline: keep each block's parameters gathered "
        "from its forward to its backward (ZeRO-2: gradients and optimizer state stay "
        "sharded), so the backward gathers nothing again; holds the whole model's parameters "
        "during a step. Strategy 'auto' decides it by speed and memory.",
    )
    compression: Literal["none", "fp16", "bf16", "powersgd", "topk"] = Field(
        "none",
        description="Compress data-parallel gradient traffic (DDP only): fp16/bf16 casts, "
        "PowerSGD low-rank, or top-k sparsification with error feedback.",
    )
    powersgd_rank: int = Field(2, ge=1, le=1_024, description="PowerSGD approximation rank.")
    topk_ratio: float = Field(
        0.01, gt=0, le=1, description="Fraction of gradient entries top-k sends each step."
    )
    topk_error_feedback: bool = Field(
        True,
        description="Carry the entries top-k did not send into the next step. Without it "
        "small gradients are never sent and training lags; off only for comparison.",
    )
    elastic: bool = Field(
        True, description="With dp_replicate > 1, keep training on the replica groups that "
        "survive a preemption or a lost worker (they take the lost group's share of each "
        "step) while a replacement is bought (or, on a fixed cluster, placed again) and "
        "heals from a live group; false: every loss stops the whole job and resumes from "
        "its checkpoint.",
    )
    min_replica_groups: int = Field(
        1, ge=1, le=100_000, description="Keep training while at least this many replica "
        "groups are alive; with fewer, the job checkpoints (or, without a notice, goes back "
        "to its latest checkpoint) and resumes on new capacity.",
    )

    @model_validator(mode="after")
    def _one_reduce_dtype(self) -> ParallelSpec:
        if self.grad_reduce_dtype == "bf16" and self.compression not in ("none", "bf16"):
            raise_if_any("ParallelSpec", [field_error(
                ("grad_reduce_dtype",), f"bf16 gradient reduction and compression "
                f"'{self.compression}' are two ways of sending gradients; a job uses one. To "
                "fix: drop grad_reduce_dtype, or set compression to none",
                self.grad_reduce_dtype)])
        return self

    @property
    def ddp_compression(self) -> str:
        """The DDP hook the job's gradients cross replicas with."""
        return "bf16" if self.grad_reduce_dtype == "bf16" else self.compression

    @model_validator(mode="after")
    def _one_recompute(self) -> ParallelSpec:
        if self.activation_checkpointing and self.recompute not in (None, "full"):
            raise_if_any("ParallelSpec", [field_error(
                ("recompute",), f"recompute '{self.recompute}' contradicts "
                "activation_checkpointing: true (which is recompute 'full'). To fix: remove "
                "activation_checkpointing and keep recompute", self.recompute)])
        return self

    @property
    def recompute_mode(self) -> str:
        """The recomputation the spec asks for: none, selective or full."""
        return self.recompute or ("full" if self.activation_checkpointing else "none")
