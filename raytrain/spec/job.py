"""What a user writes: the JobSpec and its sections, loaded from YAML, JSON or a REST body."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from raytrain.core.hardware import GPUS, node_shape, with_cpu_share
from raytrain.core.layout import Layout, ModelShape, Problem, check_layout, resolve_layout
from raytrain.core.planner import Candidate, ModelDims, NothingFits, Plan, Workload, evaluate, plan
from raytrain.core.schedule import lr_batch_scale
from raytrain.errors import FieldError, SpecError
from raytrain.spec._base import IMPORT_PATH, Strict, field_error, raise_if_any


class GPTConfig(Strict):
    """Dimensions of the built-in GPT-style decoder."""

    vocab_size: int = Field(256, ge=2, le=1_000_000, description="Number of token ids.")
    dim: int = Field(128, ge=8, description="Model (residual stream) width.")
    num_layers: int = Field(2, ge=1, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads per block; must divide dim.")
    ffn_dim: int | None = Field(
        None, ge=1, description="Hidden width of each MLP; default 4 x dim."
    )
    max_seq_len: int = Field(128, ge=2, description="Longest sequence the model accepts.")

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> GPTConfig:
        if self.dim % self.num_heads:
            raise_if_any(
                "GPTConfig",
                [
                    field_error(
                        ("num_heads",),
                        f"num_heads={self.num_heads} must divide dim={self.dim}. To fix: pick "
                        f"num_heads from the divisors of {self.dim}, e.g. "
                        f"{_nearest_divisor(self.dim, self.num_heads)}",
                        self.num_heads,
                    )
                ],
            )
        return self

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim if self.ffn_dim is not None else 4 * self.dim


def _nearest_divisor(n: int, near: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), d))


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
        "maps int64 tokens [batch, seq] to logits [batch, seq, vocab]. Only packages the "
        "operator allows (service config allowed_import_packages) are accepted.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, max_length=64,
        description="Keyword arguments passed to the factory (at most 64; the whole request "
        "body is limited to 1 MiB)."
    )

    @model_validator(mode="after")
    def _factory_matches_kind(self) -> ModelSpec:
        errors = _factory_errors(self.kind == "import", self.factory)
        unused = ("factory", "options") if self.kind == "gpt" else ("gpt",)
        errors += _unused_fields(self, unused, "model.kind")
        raise_if_any("ModelSpec", errors)
        return self


class DataSpec(Strict):
    """Where training tokens come from. Every data-parallel rank reads its own shard."""

    kind: Literal["synthetic", "token_file", "import"] = Field(
        "synthetic",
        description="'synthetic': seeded learnable token sequences; 'token_file': a flat "
        "binary file of token ids (memory-mapped); 'import': a user factory.",
    )
    seq_len: int = Field(64, ge=1, description="Tokens per training sequence.")
    seed: int = Field(0, ge=0, description="Seed of the synthetic data.")
    path: str | None = Field(None, max_length=4096,
                             description="For 'token_file': path readable by every worker.")
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
        errors = _factory_errors(self.kind == "import", self.factory)
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
        errors += _unused_fields(self, unused, "data.kind")
        raise_if_any("DataSpec", errors)
        return self


def _unused_fields(section: Strict, names: tuple[str, ...], kind_field: str
                   ) -> list[InitErrorDetails]:
    """Errors for fields set to something other than their default that mean nothing for the
    section's kind: a value that would be stored and shown but never used is refused, not
    silently kept. (A dumped spec carries every default, so defaults must pass.)"""
    kind = getattr(section, "kind")
    fields = type(section).model_fields
    return [field_error(
        (name,),
        f"{name} means nothing for {kind_field} {kind!r}. To fix: remove {name}, or choose "
        f"the kind that uses it",
        "(omitted)",
    ) for name in names if name in section.model_fields_set
        and getattr(section, name) != fields[name].get_default(call_default_factory=True)]


def _factory_errors(needed: bool, factory: str | None) -> list[InitErrorDetails]:
    if needed and not factory:
        return [
            field_error(
                ("factory",),
                "kind 'import' needs a factory. To fix: set factory to 'package.module:callable'",
                factory,
            )
        ]
    if factory and not IMPORT_PATH.match(factory):
        return [
            field_error(
                ("factory",),
                f"{factory!r} is not an import path. To fix: write it as "
                "'package.module:callable'",
                factory,
            )
        ]
    return []


class TrainingSpec(Strict):
    """The optimisation: steps, batch, AdamW with linear warmup and cosine decay, checkpoints."""

    steps: int = Field(100, ge=1, le=100_000_000, description="Optimizer steps to run.")
    global_batch_size: int = Field(
        16, ge=1, description="Sequences per optimizer step, summed over all data-parallel ranks."
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Sequences per rank per forward/backward; the rest of the global batch "
        "is reached by gradient accumulation.",
    )
    learning_rate: float = Field(3e-3, gt=0, le=10, description="Peak learning rate.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final learning rate as a fraction of the peak."
    )
    warmup_steps: int | None = Field(
        None, ge=0, description="Steps of linear warmup from zero; default 10% of steps."
    )
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay on matrices.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    grad_clip_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this; null to disable."
    )
    seed: int = Field(0, ge=0, description="Seed of the model's initial weights.")
    checkpoint_every_steps: int = Field(
        50, ge=1, description="Save a checkpoint every this many steps (and at the end)."
    )
    keep_checkpoints: int = Field(
        2, ge=1, le=1000, description="Committed checkpoints kept on storage; older ones are "
        "deleted as new ones commit. `raytrain delete ID` removes the rest once the job ended."
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="Restarts from the latest checkpoint after a worker "
        "failure."
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Compute precision. 'bf16' runs matmuls in bfloat16 with fp32 weights and "
        "optimizer; 'fp16' adds dynamic loss scaling and needs GPUs. fp32 suits CPUs.",
    )
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
    def peak_learning_rate(self) -> float:
        """learning_rate after lr_scaling for this global batch."""
        return self.learning_rate * lr_batch_scale(
            self.lr_scaling, self.global_batch_size, self.lr_reference_batch_size
        )

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else self.steps // 10


class ParallelSpec(Strict):
    """How the model is spread over the workers: one DeviceMesh of four degrees whose product
    is resources.num_workers. The strategy names the degree left out to fill the rest."""

    strategy: Literal["data", "fsdp", "tensor", "pipeline", "hybrid", "auto"] = Field(
        "data",
        description="'data': whole model per worker (DDP); 'fsdp': weights, gradients and "
        "optimizer state sharded (FSDP2); 'tensor': each layer split over workers; "
        "'pipeline': layers split into stages; 'hybrid': every degree given explicitly; "
        "'auto': the planner's fastest layout that fits (built-in GPT). The strategy's own "
        "degree defaults to num_workers over the others.",
    )
    dp_replicate: int | None = Field(
        None, ge=1, description="Data-parallel replicas (DDP, or HSDP's replicate dimension)."
    )
    dp_shard: int | None = Field(
        None, ge=1, description="Ranks each replica's weights are sharded over (FSDP2)."
    )
    tp: int | None = Field(None, ge=1, description="Tensor-parallel degree.")
    pp: int | None = Field(None, ge=1, description="Pipeline-parallel ranks.")
    virtual_stages: int = Field(
        1, ge=1, description="Pipeline stages per pipeline rank (interleaved_1f1b only)."
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
        False, description="Recompute each block's activations in the backward pass."
    )
    compression: Literal["none", "fp16", "bf16", "powersgd", "topk"] = Field(
        "none",
        description="Compress data-parallel gradient traffic (DDP only): fp16/bf16 casts, "
        "PowerSGD low-rank, or top-k sparsification with error feedback.",
    )
    powersgd_rank: int = Field(2, ge=1, description="PowerSGD approximation rank.")
    topk_ratio: float = Field(
        0.01, gt=0, le=1, description="Fraction of gradient entries top-k sends each step."
    )
    topk_error_feedback: bool = Field(
        True,
        description="Carry the entries top-k did not send into the next step. Without it "
        "small gradients are never sent and training lags; off only for comparison.",
    )


def accelerator_errors(accelerator: str | None, loc: tuple[str, ...] = ("accelerator",)
                        ) -> list[InitErrorDetails]:
    if accelerator is None or accelerator in GPUS:
        return []
    return [field_error(
        loc,
        f"unknown accelerator {accelerator!r}. To fix: use one of " + ", ".join(sorted(GPUS)),
        accelerator,
    )]


class ResourcesSpec(Strict):
    """What each training worker needs. GPUs imply NCCL; CPU-only workers use gloo."""

    num_workers: int = Field(2, ge=1, le=100_000, description="Training processes.")
    cpus_per_worker: float = Field(1.0, gt=0, le=1024, description="CPUs reserved per worker.")
    gpus_per_worker: float = Field(
        0.0, ge=0, le=16, description="GPUs per worker; 0 trains on CPU with gloo."
    )
    accelerator: str | None = Field(
        None,
        description="GPU kind, for the planner's predictions and for strategy 'auto': one of "
        + ", ".join(sorted(k for k in GPUS if k != "cpu")) + ". CPU workers are 'cpu'.",
    )

    @model_validator(mode="after")
    def _accelerator_known(self) -> ResourcesSpec:
        raise_if_any("ResourcesSpec", accelerator_errors(self.accelerator))
        return self

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def device_kind(self) -> str | None:
        """The catalog kind the workers run on, when known."""
        return self.accelerator if self.use_gpu else "cpu"


Market = Literal["spot", "on-demand"]


class CapacitySpec(Strict):
    """How the service buys capacity for the job (on an autoscaling cluster); ignored on a
    fixed local cluster, where the job runs on what is there."""

    policy: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="A named autoscaling policy from policies/ (cost-first, deadline-aware, "
        "on-demand-only, spot-only); default: the service's.",
    )
    market: Literal["auto", "spot", "on-demand"] = Field(
        "auto", description="Restrict to one market; 'auto' lets the policy choose."
    )
    deadline_hours: float | None = Field(
        None, gt=0, le=24 * 366,
        description="Finish within this many hours of submission, if possible."
    )
    budget_usd: float | None = Field(
        None, gt=0, le=1e9, description="Do not choose capacity expected to cost more than this."
    )
    max_usd_per_hour: float | None = Field(
        None, gt=0, le=1e7,
        description="Never hold capacity priced above this per hour, all nodes."
    )


class JobSpec(Strict):
    """A whole training job: the user's entire surface."""

    name: str = Field(
        "job",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="A label for people; need not be unique.",
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="The model to train.")
    data: DataSpec = Field(default_factory=DataSpec, description="The training tokens.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimisation.")
    parallel: ParallelSpec = Field(default_factory=ParallelSpec, description="Parallel layout.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Workers and what each needs."
    )
    capacity: CapacitySpec = Field(
        default_factory=CapacitySpec, description="How capacity is bought (autoscaling)."
    )

    @model_validator(mode="after")
    def _sections_agree(self) -> JobSpec:
        errors: list[InitErrorDetails] = []
        parallel, training, resources = self.parallel, self.training, self.resources
        layout, problems = self._layout_and_problems()
        per_step = training.micro_batch_size * layout.dp
        if training.global_batch_size % per_step:
            fits = max(per_step, training.global_batch_size // per_step * per_step)
            errors.append(
                field_error(
                    ("training", "global_batch_size"),
                    f"global_batch_size={training.global_batch_size} is not a multiple of "
                    f"micro_batch_size x data-parallel ranks = {training.micro_batch_size}"
                    f" x {layout.dp} = {per_step}. To fix: use {fits} or another multiple of "
                    f"{per_step}",
                    training.global_batch_size,
                )
            )
        elif not problems:
            shape = ModelShape()
            if self.model.kind == "gpt":
                gpt = self.model.gpt
                shape = ModelShape(gpt.num_layers, gpt.num_heads, gpt.hidden_dim, gpt.vocab_size,
                                   gpt.max_seq_len)
            problems = check_layout(layout, shape, self.data.seq_len, self.model.kind == "gpt")
        for problem in problems:
            errors.append(field_error(problem.field, problem.message, None))
        if parallel.compression != "none" and layout.data_parallel_wrapper != "ddp":
            errors.append(
                field_error(
                    ("parallel", "compression"),
                    f"gradient compression rides on DDP's communication hooks, but this layout "
                    f"({layout.describe()}) uses "
                    + ("FSDP2" if layout.data_parallel_wrapper == "fsdp" else "no data "
                       "parallelism")
                    + ". To fix: set compression to 'none', or use data parallelism "
                    "(dp_replicate > 1) without tp or dp_shard",
                    parallel.compression,
                )
            )
        if training.precision == "fp16" and layout.pp > 1:
            errors.append(
                field_error(
                    ("training", "precision"),
                    "fp16 loss scaling is not wired through pipeline schedules. To fix: use "
                    "'bf16' (no loss scaling needed) with pipeline parallelism",
                    training.precision,
                )
            )
        if training.precision == "fp16" and not resources.use_gpu:
            errors.append(
                field_error(
                    ("training", "precision"),
                    "fp16 with loss scaling needs GPUs. To fix: use 'bf16' or 'fp32' on CPU, "
                    "or set resources.gpus_per_worker",
                    training.precision,
                )
            )
        if self.model.kind == "gpt" and self.data.seq_len > self.model.gpt.max_seq_len:
            errors.append(
                field_error(
                    ("data", "seq_len"),
                    f"seq_len={self.data.seq_len} exceeds model.gpt.max_seq_len="
                    f"{self.model.gpt.max_seq_len}. To fix: lower data.seq_len or raise "
                    "model.gpt.max_seq_len",
                    self.data.seq_len,
                )
            )
        raise_if_any("JobSpec", errors)
        return self

    def _layout_and_problems(self) -> tuple[Layout, list[Problem]]:
        parallel, training = self.parallel, self.training
        if parallel.strategy == "auto":
            return self._planned_layout()
        layout, problems = resolve_layout(
            parallel.strategy,
            self.resources.num_workers,
            {name: getattr(parallel, name) for name in ("dp_replicate", "dp_shard", "tp", "pp")},
            virtual_stages=parallel.virtual_stages,
            schedule=parallel.pipeline_schedule,
            sequence_parallel=parallel.sequence_parallel,
        )
        accum = max(1, training.global_batch_size // (training.micro_batch_size * layout.dp))
        return replace(layout, microbatches=accum), problems

    def _planned_layout(self) -> tuple[Layout, list[Problem]]:
        """strategy 'auto': the planner's fastest fitting layout for this model and hardware."""
        here = ("parallel", "strategy")
        if self.model.kind != "gpt":
            return Layout(dp_replicate=self.resources.num_workers), []  # dims unknown: DDP
        if self.resources.device_kind is None:
            return Layout(), [Problem(("resources", "accelerator"), (
                "strategy 'auto' plans for a GPU kind. To fix: set resources.accelerator "
                "(e.g. 'h100-sxm'), or choose a strategy"))]
        try:
            best = self.plans(keep=1)[0]
        except NothingFits as exc:
            return Layout(), [Problem(here, str(exc))]
        c = best.candidate
        return Layout(dp_replicate=c.dp_replicate, dp_shard=c.dp_shard, tp=c.tp, pp=c.pp,
                      virtual_stages=c.virtual_stages, microbatches=c.microbatches,
                      schedule=c.schedule if c.pp > 1 else self.parallel.pipeline_schedule,
                      sequence_parallel=True), []

    def planner_inputs(self, gpus: int | None = None, accelerator: str | None = None
                       ) -> tuple[ModelDims, Workload, str, int]:
        """What the planner needs to know of this job (built-in GPT only)."""
        gpt = self.model.gpt
        dims = ModelDims.from_gpt(gpt.num_layers, gpt.dim, gpt.num_heads, gpt.hidden_dim,
                                  gpt.vocab_size, self.data.seq_len, gpt.max_seq_len)
        work = Workload(
            global_batch=self.training.global_batch_size,
            precision="fp32" if self.training.precision == "fp32" else "bf16",
            recompute_options=("full",) if self.parallel.activation_checkpointing
            else ("none",),
            micro_batch_options=(self.training.micro_batch_size,),
        )
        kind = accelerator or self.resources.device_kind or "cpu"
        return dims, work, kind, gpus or self.resources.num_workers

    def plans(self, gpus: int | None = None, accelerator: str | None = None,
              usd_per_device_hour: float | None = None, keep: int = 20) -> list[Plan]:
        """Ranked plans for this job (raises NothingFits with what would)."""
        dims, work, kind, count = self.planner_inputs(gpus, accelerator)
        return plan(dims, work, kind, count, usd_per_device_hour, keep=keep)

    def predicted(self) -> Plan | None:
        """The planner's figures for this job's own layout, when the model is the built-in GPT
        and the device kind is known."""
        if self.model.kind != "gpt" or self.resources.device_kind is None:
            return None
        dims, work, kind, _ = self.planner_inputs()
        shape = with_cpu_share(node_shape(kind), self.resources.cpus_per_worker)
        return evaluate(dims, work, self.own_candidate(), shape)

    def own_candidate(self) -> Candidate:
        """This job's layout in the planner's terms (built-in GPT)."""
        layout = self.layout
        return Candidate(layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp,
                         layout.virtual_stages, self.training.micro_batch_size,
                         layout.microbatches,
                         "full" if self.parallel.activation_checkpointing else "none",
                         gpipe=layout.pp > 1 and layout.schedule == "gpipe")

    @cached_property
    def layout(self) -> Layout:
        """The resolved parallel layout (valid: the spec was checked on construction)."""
        return self._layout_and_problems()[0]

    @property
    def data_parallel_degree(self) -> int:
        return self.layout.dp

    @property
    def grad_accum_steps(self) -> int:
        return self.training.global_batch_size // (
            self.training.micro_batch_size * self.data_parallel_degree
        )

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.data.seq_len

    def import_paths(self) -> list[tuple[tuple[str, ...], str]]:
        """Every user import path in the spec, with its field path."""
        found = []
        if self.model.kind == "import" and self.model.factory:
            found.append((("model", "factory"), self.model.factory))
        if self.data.kind == "import" and self.data.factory:
            found.append((("data", "factory"), self.data.factory))
        return found


def check_imports_allowed(spec: JobSpec, allowed_packages: list[str]) -> None:
    """Raise SpecError for any import path outside the operator's allowed packages.

        check_imports_allowed(spec, ["mylab"])  # 'mylab.models:build' passes, 'os:system' not
    """
    errors = []
    for loc, path in spec.import_paths():
        module = path.split(":", 1)[0]
        if not any(module == pkg or module.startswith(pkg + ".") for pkg in allowed_packages):
            allowed = ", ".join(allowed_packages) or "none"
            errors.append(
                FieldError(
                    loc,
                    f"{path!r} is outside the packages this service allows ({allowed}). To fix: "
                    "ask the operator to add its package to allowed_import_packages "
                    "(raytrain serve --allow-import PACKAGE), or use a built-in model/data kind",
                )
            )
    if errors:
        raise SpecError(errors)


def spec_error_from_validation(exc: ValidationError, source: str = "job spec") -> SpecError:
    return SpecError(
        [FieldError(tuple(err["loc"]), err["msg"]) for err in exc.errors()], source=source
    )


def parse_job_spec(document: dict[str, Any]) -> JobSpec:
    """Validate a parsed document into a JobSpec, raising SpecError with field paths."""
    if not isinstance(document, dict):
        raise SpecError([FieldError((), "a job spec must be a mapping of sections")])
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        raise spec_error_from_validation(exc) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a JobSpec from a YAML or JSON file.

        spec = load_job_spec("examples/demo.yaml")
    """
    return parse_job_spec(_read_document(Path(path), "job spec"))


def _read_document(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(
            [FieldError((), f"cannot read {path}: {exc.strerror}. To fix: check the path")],
            source=what,
        ) from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(
            [FieldError((), f"{path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}")],
            source=what,
        ) from None
    return document if document is not None else {}
