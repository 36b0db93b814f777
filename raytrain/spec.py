"""The wire and file schema: what a user writes (JobSpec), what the service answers (JobStatus,
JobEvent) and how an operator configures the service (ServiceConfig).

One pydantic schema validates YAML files, REST bodies and stored records alike. Every model is
strict (`extra="forbid"`), every field is described and has a safe default. Cross-field rules
(batch divisibility, degrees that multiply to the worker count, sequence length within the
model's reach) are checked here too and reported at the path of the field to change.

    spec = load_job_spec("examples/demo.yaml")
    spec = JobSpec.model_validate({"training": {"steps": 200}})
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from raytrain.core.hardware import CATALOG_VERSION, GPUS, LINKS, node_shape, with_cpu_share
from raytrain.core.layout import Layout, ModelShape, Problem, check_layout, resolve_layout
from raytrain.core.planner import Candidate, ModelDims, NothingFits, Plan, Workload, evaluate, plan
from raytrain.core.schedule import lr_batch_scale
from raytrain.errors import FieldError, SpecError

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _field_error(loc: tuple[str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("invalid_combination", message), loc=loc, input=value
    )


def _raise_if_any(title: str, errors: list[InitErrorDetails]) -> None:
    if errors:
        raise ValidationError.from_exception_data(title, errors)


# ---------------------------------------------------------------------------------------- job


class GPTConfig(_Strict):
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
            _raise_if_any(
                "GPTConfig",
                [
                    _field_error(
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


class ModelSpec(_Strict):
    """Which model to train: the built-in GPT, or the user's own by import path."""

    kind: Literal["gpt", "import"] = Field(
        "gpt", description="'gpt' for the built-in decoder, 'import' for a user factory."
    )
    gpt: GPTConfig = Field(default_factory=GPTConfig, description="Built-in GPT dimensions.")
    factory: str | None = Field(
        None,
        description="For kind 'import': 'package.module:callable' returning an nn.Module that "
        "maps int64 tokens [batch, seq] to logits [batch, seq, vocab]. Only packages the "
        "operator allows (service config allowed_import_packages) are accepted.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the factory."
    )

    @model_validator(mode="after")
    def _factory_matches_kind(self) -> ModelSpec:
        _raise_if_any("ModelSpec", _factory_errors(self.kind == "import", self.factory))
        return self


class DataSpec(_Strict):
    """Where training tokens come from. Every data-parallel rank reads its own shard."""

    kind: Literal["synthetic", "token_file", "import"] = Field(
        "synthetic",
        description="'synthetic': seeded learnable token sequences; 'token_file': a flat "
        "binary file of token ids (memory-mapped); 'import': a user factory.",
    )
    seq_len: int = Field(64, ge=1, description="Tokens per training sequence.")
    seed: int = Field(0, ge=0, description="Seed of the synthetic data.")
    path: str | None = Field(None, description="For 'token_file': path readable by every worker.")
    dtype: Literal["uint16", "uint32"] = Field(
        "uint16", description="For 'token_file': integer type of the stored token ids."
    )
    factory: str | None = Field(
        None,
        description="For kind 'import': 'package.module:callable' returning a map-style dataset "
        "whose items are int64 tensors of seq_len + 1 tokens.",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the factory."
    )

    @model_validator(mode="after")
    def _source_is_complete(self) -> DataSpec:
        errors = _factory_errors(self.kind == "import", self.factory)
        if self.kind == "token_file" and not self.path:
            errors.append(
                _field_error(
                    ("path",),
                    "data.kind 'token_file' needs a path. To fix: set data.path to a flat "
                    "binary file of token ids",
                    self.path,
                )
            )
        _raise_if_any("DataSpec", errors)
        return self


def _factory_errors(needed: bool, factory: str | None) -> list[InitErrorDetails]:
    if needed and not factory:
        return [
            _field_error(
                ("factory",),
                "kind 'import' needs a factory. To fix: set factory to 'package.module:callable'",
                factory,
            )
        ]
    if factory and not _IMPORT_PATH.match(factory):
        return [
            _field_error(
                ("factory",),
                f"{factory!r} is not an import path. To fix: write it as "
                "'package.module:callable'",
                factory,
            )
        ]
    return []


class TrainingSpec(_Strict):
    """The optimisation: steps, batch, AdamW with linear warmup and cosine decay, checkpoints."""

    steps: int = Field(100, ge=1, description="Optimizer steps to run.")
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
    max_restarts: int = Field(
        3, ge=0, description="Restarts from the latest checkpoint after a worker failure."
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
            errors.append(_field_error(
                ("warmup_steps",),
                f"warmup_steps={self.warmup_steps} exceeds steps={self.steps}. To fix: "
                "lower warmup_steps or raise steps",
                self.warmup_steps,
            ))
        if self.lr_scaling != "none" and self.lr_reference_batch_size is None:
            errors.append(_field_error(
                ("lr_reference_batch_size",),
                f"lr_scaling '{self.lr_scaling}' scales from the batch size learning_rate "
                "was tuned for. To fix: set lr_reference_batch_size to that batch size",
                None,
            ))
        _raise_if_any("TrainingSpec", errors)
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


class ParallelSpec(_Strict):
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


def _accelerator_errors(accelerator: str | None, loc: tuple[str, ...] = ("accelerator",)
                        ) -> list[InitErrorDetails]:
    if accelerator is None or accelerator in GPUS:
        return []
    return [_field_error(
        loc,
        f"unknown accelerator {accelerator!r}. To fix: use one of " + ", ".join(sorted(GPUS)),
        accelerator,
    )]


class ResourcesSpec(_Strict):
    """What each training worker needs. GPUs imply NCCL; CPU-only workers use gloo."""

    num_workers: int = Field(2, ge=1, le=100_000, description="Training processes.")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs reserved per worker.")
    gpus_per_worker: float = Field(
        0.0, ge=0, description="GPUs per worker; 0 trains on CPU with gloo."
    )
    accelerator: str | None = Field(
        None,
        description="GPU kind, for the planner's predictions and for strategy 'auto': one of "
        + ", ".join(sorted(k for k in GPUS if k != "cpu")) + ". CPU workers are 'cpu'.",
    )

    @model_validator(mode="after")
    def _accelerator_known(self) -> ResourcesSpec:
        _raise_if_any("ResourcesSpec", _accelerator_errors(self.accelerator))
        return self

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def device_kind(self) -> str | None:
        """The catalog kind the workers run on, when known."""
        return self.accelerator if self.use_gpu else "cpu"


Market = Literal["spot", "on-demand"]


class CapacitySpec(_Strict):
    """How the service buys capacity for the job (on an autoscaling cluster); ignored on a
    fixed local cluster, where the job runs on what is there."""

    policy: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="A named autoscaling policy from policies/ (cost-first, deadline-aware, "
        "on-demand-only, spot-only); default: the service's.",
    )
    market: Literal["auto", "spot", "on-demand"] = Field(
        "auto", description="Restrict to one market; 'auto' lets the policy choose."
    )
    deadline_hours: float | None = Field(
        None, gt=0, description="Finish within this many hours of submission, if possible."
    )
    budget_usd: float | None = Field(
        None, gt=0, description="Do not choose capacity expected to cost more than this."
    )
    max_usd_per_hour: float | None = Field(
        None, gt=0, description="Never hold capacity priced above this per hour, all nodes."
    )


class JobSpec(_Strict):
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
                _field_error(
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
            errors.append(_field_error(problem.field, problem.message, None))
        if parallel.compression != "none" and layout.data_parallel_wrapper != "ddp":
            errors.append(
                _field_error(
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
                _field_error(
                    ("training", "precision"),
                    "fp16 loss scaling is not wired through pipeline schedules. To fix: use "
                    "'bf16' (no loss scaling needed) with pipeline parallelism",
                    training.precision,
                )
            )
        if training.precision == "fp16" and not resources.use_gpu:
            errors.append(
                _field_error(
                    ("training", "precision"),
                    "fp16 with loss scaling needs GPUs. To fix: use 'bf16' or 'fp32' on CPU, "
                    "or set resources.gpus_per_worker",
                    training.precision,
                )
            )
        if self.model.kind == "gpt" and self.data.seq_len > self.model.gpt.max_seq_len:
            errors.append(
                _field_error(
                    ("data", "seq_len"),
                    f"seq_len={self.data.seq_len} exceeds model.gpt.max_seq_len="
                    f"{self.model.gpt.max_seq_len}. To fix: lower data.seq_len or raise "
                    "model.gpt.max_seq_len",
                    self.data.seq_len,
                )
            )
        _raise_if_any("JobSpec", errors)
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


# ------------------------------------------------------------------------------------- status


class JobState(str, Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Progress(_Record):
    step: int = Field(0, description="Optimizer steps completed.")
    total_steps: int = Field(0, description="Optimizer steps the job will run.")
    loss: float | None = Field(None, description="Training loss of the latest step.")
    first_loss: float | None = Field(None, description="Training loss of the first step.")
    tokens_per_s: float | None = Field(None, description="Recent training throughput.")
    elapsed_s: float = Field(0.0, description="Seconds since training started.")
    eta_s: float | None = Field(None, description="Estimated seconds to finish.")


class Resources(_Record):
    accelerator: str = Field("cpu", description="The accelerator kind the workers run on.")
    node_type: str | None = Field(None, description="The Ray node type, when autoscaled.")
    offer: str | None = Field(None, description="The offer bought, when autoscaled.")
    market: Literal["local", "spot", "on-demand"] = Field("local", description="How bought.")
    nodes: int = Field(0, description="Nodes the workers span.")
    gpus: float = Field(0, description="GPUs held by the job.")
    cpus: float = Field(0, description="CPUs held by the job.")
    hourly_usd: float = Field(0.0, description="Price of the held capacity per hour.")


class PlanSummary(_Record):
    strategy: str = Field(description="The parallel strategy.")
    layout: dict[str, int] = Field(description="Degree of each parallel axis.")
    description: str = Field("", description="The layout in words, e.g. 'dp_shard2 tp2'.")
    predicted_step_s: float | None = Field(None, description="The planner's step time.")
    predicted_tokens_per_s: float | None = Field(None, description="The planner's throughput.")
    predicted_memory_gib: float | None = Field(
        None, description="The planner's memory per device (weights, gradients, optimizer "
        "state, activations)."
    )
    measured_step_s: float | None = Field(
        None, description="Step time from the latest progress report, once running."
    )
    reason: str | None = Field(None, description="The planner's one-line account of the plan.")
    grad_accum_steps: int = Field(description="Micro-batches accumulated per optimizer step.")
    tokens_per_step: int = Field(description="Tokens per optimizer step, all ranks.")
    backend: str = Field(description="Collective backend: nccl on GPU, gloo on CPU.")


class CheckpointInfo(_Record):
    step: int = Field(description="Optimizer steps the checkpoint includes.")
    path: str = Field(description="Directory of the checkpoint.")


class PreemptionRecord(_Record):
    time: float = Field(description="Unix time the workers stopped (or were lost).")
    notice: bool = Field(description="Whether an interruption notice came first.")
    reached_step: int = Field(description="Step the job reached: exact after a notice; "
                              "after a loss without one, its last report (a lower bound).")
    checkpoint_step: int | None = Field(description="The checkpoint it resumes from.")
    lost_steps: int = Field(description="Steps trained since that checkpoint, to redo (a "
                            "lower bound without a notice).")
    notice_to_checkpoint_s: float | None = Field(
        None, description="From the notice to the checkpoint being durable.")
    capacity_to_first_step_s: float | None = Field(
        None, description="From the new capacity in hand to the first step after resuming.")
    down_s: float | None = Field(None, description="From stopping to training again.")
    before: str = Field(description="Nodes and layout before.")
    after: str | None = Field(None, description="Nodes and layout after resuming.")
    extra_cost_usd: float = Field(
        0.0, description="Nodes billed while the job was down, plus the lost steps' time.")


class JobResult(_Record):
    first_loss: float = Field(description="Loss of the first step of the job.")
    final_loss: float = Field(description="Loss of the last step.")
    steps: int = Field(description="Optimizer steps completed.")
    train_wall_s: float = Field(description="Seconds of the final training attempt.")
    tokens_per_s: float = Field(description="Mean throughput of the final attempt.")


class JobStatus(_Record):
    id: str
    state: JobState
    spec: JobSpec
    plan: PlanSummary | None = None
    progress: Progress = Field(default_factory=Progress)
    resources: Resources = Field(default_factory=Resources)
    cost_usd: float = 0.0
    restarts: int = Field(0, description="Times training restarted from a checkpoint.")
    preemptions: int = Field(0, description="Spot preemptions survived.")
    error: str | None = Field(None, description="Why the job failed; null unless FAILED.")
    message: str | None = Field(None, description="What the job waits for, when it waits.")
    checkpoint: CheckpointInfo | None = Field(None, description="The latest durable checkpoint.")
    decisions: list[DecisionRecord] = Field(
        default_factory=list, description="The autoscaling policy's decisions, with reasons."
    )
    preemption_log: list[PreemptionRecord] = Field(
        default_factory=list, description="Every preemption survived: what it cost."
    )
    lost_steps: int = Field(0, description="Steps redone after preemptions, all of them.")
    down_s: float = Field(0.0, description="Seconds not training after preemptions, in all.")
    preemption_cost_usd: float = Field(
        0.0, description="What the preemptions cost in all (nodes held while down, redone "
        "steps).")
    result: JobResult | None = Field(None, description="Final figures once SUCCEEDED.")
    created_at: float = Field(description="Unix time of submission.")
    started_at: float | None = Field(None, description="Unix time training first started.")
    finished_at: float | None = Field(None, description="Unix time the job ended.")


class JobEvent(_Record):
    seq: int = Field(description="Position in the job's event stream, from 0.")
    type: Literal["state", "progress", "checkpoint", "preemption", "end"]
    job_id: str
    time: float
    data: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------- offers and policies


class Offer(_Strict):
    """One instance type one provider rents, with its prices and spot interruption rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(description="aws, or the GPU cloud that rents it.")
    region: str = Field(description="Region the prices are for.")
    spot_zone: str | None = Field(None, description="Zone of the cheapest spot price.")
    instance_type: str = Field(description="The provider's name for the instance type.")
    gpu_kind: str = Field(description="A GPU kind of the hardware catalog.")
    gpus_per_node: int = Field(ge=1, description="GPUs per instance.")
    intra_link: str = Field(description="Link between the GPUs of one node (catalog name).")
    network_gbps: float = Field(gt=0, description="Network bandwidth between nodes, Gbit/s.")
    rdma: bool = Field(False, description="RDMA between nodes (EFA, InfiniBand).")
    on_demand_usd_per_hour: float | None = Field(None, ge=0, description="Per node.")
    spot_usd_per_hour: float | None = Field(None, ge=0, description="Per node; null: no spot.")
    spot_interruptions_per_hour: float = Field(
        0.0, ge=0, description="Expected spot interruptions per node-hour."
    )
    interruption_band: str | None = Field(
        None, description="The provider's published band, e.g. AWS Spot Advisor '>20%' a month."
    )
    note: str = Field("", description="Where the figures come from.")

    @model_validator(mode="after")
    def _known_parts(self) -> Offer:
        errors = _accelerator_errors(self.gpu_kind, ("gpu_kind",))
        if self.intra_link not in LINKS:
            errors.append(_field_error(("intra_link",), f"unknown link {self.intra_link!r}. "
                                       "To fix: use one of " + ", ".join(sorted(LINKS)),
                                       self.intra_link))
        if self.on_demand_usd_per_hour is None and self.spot_usd_per_hour is None:
            errors.append(_field_error(("on_demand_usd_per_hour",), "an offer needs a price. "
                                       "To fix: give on_demand_usd_per_hour or "
                                       "spot_usd_per_hour", None))
        _raise_if_any("Offer", errors)
        return self

    @property
    def id(self) -> str:
        return f"{self.provider}/{self.region}/{self.instance_type}"

    def usd_per_hour(self, market: str) -> float | None:
        return self.spot_usd_per_hour if market == "spot" else self.on_demand_usd_per_hour

    def markets(self) -> list[str]:
        return [m for m in ("spot", "on-demand") if self.usd_per_hour(m) is not None]



class OfferCatalog(_Record):
    version: str = Field(description="Date of the figures (snapshot) or of the refresh.")
    source: Literal["snapshot", "aws", "file"] = Field(description="Where the offers came from.")
    fetched_at: float | None = Field(None, description="Unix time of the refresh, if any.")
    warnings: list[str] = Field(default_factory=list, description="What could not be refreshed.")
    offers: list[Offer]

    def find(self, offer_id: str) -> Offer | None:
        return next((o for o in self.offers if o.id == offer_id), None)


class PolicySpec(_Strict):
    """A named autoscaling policy (policies/*.yaml): how the service buys capacity."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="The file's stem.")
    description: str = Field(description="One line for `raytrain offers`.")
    markets: list[Market] = Field(
        ["spot", "on-demand"], min_length=1, description="Markets the policy may buy."
    )
    objective: Literal["cost", "time"] = Field(
        "cost", description="Minimise expected dollars to finish, or expected hours."
    )
    deadline_margin: float = Field(
        0.15, ge=0, le=2, description="Plans must finish this fraction before the deadline."
    )
    failover_after_preemptions: int | None = Field(
        None, ge=1, description="Move to on-demand after this many preemptions; null: never."
    )
    capacity_wait_s: float = Field(
        600.0, gt=0, description="Spot capacity missing this long: take the next best offer."
    )
    switch_min_saving: float = Field(
        0.2, ge=0, le=1,
        description="Move a running job to a cheaper offer only when the expected cost to "
        "finish falls by this fraction (and by more than the move costs).",
    )
    checkpoint_interval_s: float | None = Field(
        None, gt=0, description="Seconds between periodic checkpoints; null: Young/Daly optimum."
    )
    max_checkpoint_interval_s: float = Field(
        3600.0, gt=0, description="Checkpoint at least this often, whatever the optimum says "
        "(it trusts a rate measured over few preemptions)."
    )
    checkpoint_cost_s: float = Field(
        60.0, gt=0, description="Assumed seconds one checkpoint costs, until one is measured."
    )
    restart_s: float = Field(
        300.0, ge=0, description="Assumed seconds from new capacity to the first step again."
    )
    notice_coverage: float = Field(
        0.0, ge=0, le=1,
        description="Fraction of preemptions whose notice leaves time to checkpoint (no work "
        "lost); 0 counts every preemption as losing half an interval.",
    )
    max_nodes: int = Field(16, ge=1, le=4096, description="Most nodes one job may hold.")
    prior_node_hours: float = Field(
        20.0, gt=0, description="Weight of the catalog's interruption rate against preemptions "
        "observed, in node-hours.",
    )

    @model_validator(mode="after")
    def _failover_needs_both(self) -> PolicySpec:
        if self.failover_after_preemptions is not None and self.markets != ["spot", "on-demand"]:
            _raise_if_any("PolicySpec", [_field_error(
                ("failover_after_preemptions",),
                "failing over to on-demand needs markets [spot, on-demand]. To fix: list both "
                "markets or drop failover_after_preemptions", self.failover_after_preemptions)])
        return self


class OffersRequest(_Strict):
    """POST /v1/offers: rank the offers for a job that has not been submitted."""

    spec: JobSpec = Field(description="The job to rank offers for.")
    policy: str | None = Field(None, description="Policy name; default: the job's, else the "
                               "service's.")
    keep: int = Field(20, ge=1, le=500, description="How many options to return.")


class OfferRow(_Record):
    """One option of the policy's ranking: an offer, a market and a node count for a job."""

    rank: int
    offer: str
    instance_type: str
    gpu_kind: str
    market: Market
    nodes: int
    gpus: int
    usd_per_hour: float = Field(description="All nodes.")
    tokens_per_s: float
    layout: str
    preemptions_per_hour: float
    checkpoint_interval_s: float | None
    expected_hours: float
    expected_cost_usd: float


class OffersResponse(_Record):
    catalog_version: str
    source: str
    warnings: list[str]
    offers: list[Offer]
    policy: str | None = Field(None, description="The policy that ranked, with a job.")
    ranking: list[OfferRow] = Field(default_factory=list)
    decision: str | None = Field(None, description="What the policy would do, and why.")


class NodeTypeBinding(_Strict):
    offer: str = Field(description="Id of the offer the node type buys (provider/region/type).")
    market: Market = Field(description="spot or on-demand.")
    max_nodes: int = Field(0, ge=0, description="The node type's max_workers; 0: no limit.")


class DecisionRecord(_Record):
    time: float = Field(description="Unix time of the decision.")
    event: str = Field(description="What prompted it: submit, preemption, deadline, ...")
    action: str = Field(description="start, stay, switch, wait.")
    offer: str | None = Field(None, description="The chosen offer's id.")
    market: str | None = None
    nodes: int = 0
    usd_per_hour: float = 0.0
    expected_hours: float | None = None
    expected_cost_usd: float | None = None
    checkpoint_interval_s: float | None = None
    reason: str = Field(description="Why, in one line.")


# -------------------------------------------------------------------------------------- service


class ServiceConfig(_Strict):
    """How an operator runs the service (`raytrain serve` flags or a YAML file)."""

    state_dir: str = Field(
        "~/.raytrain",
        description="Directory on the head node for the job store; checkpoints go under "
        "storage_path. Must survive service restarts.",
    )
    storage_path: str | None = Field(
        None,
        description="Where workers write checkpoints; must be reachable by every worker "
        "(shared filesystem on a multi-node cluster). Default: <state_dir>/jobs.",
    )
    allowed_import_packages: list[str] = Field(
        default_factory=list,
        description="Packages whose factories jobs may import (model.factory, data.factory).",
    )
    scheduler_interval_s: float = Field(
        1.0, gt=0, le=60, description="How often queued jobs are checked against free capacity."
    )
    node_types: dict[str, NodeTypeBinding] = Field(
        default_factory=dict,
        description="Ray node types the service may ask the autoscaler for, each with the "
        "offer and market it buys (`raytrain serve --cluster-config` fills it from a cluster "
        "YAML). Empty: a fixed cluster; jobs run on what is there.",
    )
    offers_file: str | None = Field(
        None, description="An offer catalog (YAML or JSON) to use instead of the refreshed "
        "cache in state_dir or the shipped snapshot.",
    )
    policy_dir: str | None = Field(
        None, description="Folder of named policies; default: policies/ of the installation."
    )
    default_policy: str = Field(
        "cost-first", description="The policy of jobs that name none."
    )
    review_interval_s: float = Field(
        300.0, gt=0, description="How often the policy looks at a running job again (the "
        "deadline); a change of the offers prompts a look at once.",
    )
    interruption_endpoint: str | None = Field(
        "http://169.254.169.254",
        description="Instance metadata service every worker watches for spot interruption "
        "notices (IMDSv2); null: do not watch. Where there is none, the watcher stops after "
        "its first try.",
    )

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.storage_path).expanduser() if self.storage_path else self.state_path / "jobs"


# ------------------------------------------------------------------------------------ plans


class PlanRequest(_Strict):
    """POST /v1/plans: rank the layouts of a job on some hardware."""

    spec: JobSpec = Field(description="The job (its model, batch and precision matter).")
    gpus: int | None = Field(None, ge=1, description="Devices; default resources.num_workers.")
    accelerator: str | None = Field(
        None, description="Device kind; default resources.accelerator, or 'cpu'."
    )
    usd_per_gpu_hour: float | None = Field(
        None, ge=0, description="Hourly price per device, for dollars per million tokens."
    )
    keep: int = Field(10, ge=1, le=200, description="How many plans to return.")

    @model_validator(mode="after")
    def _kind_known(self) -> PlanRequest:
        _raise_if_any("PlanRequest", _accelerator_errors(self.accelerator))
        if self.spec.model.kind != "gpt":
            _raise_if_any("PlanRequest", [_field_error(
                ("spec", "model", "kind"),
                "the planner needs the model's dimensions: it plans the built-in GPT. To "
                "fix: describe your model as model.gpt, or pick a strategy yourself",
                self.spec.model.kind,
            )])
        return self


class PlanRow(_Record):
    rank: int
    layout: str = Field(description="Degrees, schedule, micro-batch x count, recomputation.")
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    virtual_stages: int
    micro_batch_size: int
    microbatches: int
    recompute: str
    step_s: float
    tokens_per_s: float
    mfu: float
    memory_gib: float = Field(description="Predicted memory per device.")
    memory_limit_gib: float = Field(description="Usable memory per device.")
    scaling_efficiency: float = Field(description="Throughput over N x one device's.")
    usd_per_million_tokens: float | None
    reason: str


class PlanResponse(_Record):
    accelerator: str
    gpus: int
    catalog_version: str
    plans: list[PlanRow]


def rank_plans(request: PlanRequest) -> PlanResponse:
    """The ranked plans for a request; raises NothingFits with the smallest changes."""
    spec = request.spec
    dims, work, kind, gpus = spec.planner_inputs(request.gpus, request.accelerator)
    # Ranking searches micro-batch sizes and recomputation too, not only the spec's own.
    work = replace(work, micro_batch_options=(1, 2, 4, 8, 16), recompute_options=("none", "full"))
    plans = plan(dims, work, kind, gpus, request.usd_per_gpu_hour, keep=request.keep)
    rows = []
    for index, p in enumerate(plans, start=1):
        c = p.candidate
        rows.append(PlanRow(
            rank=index, layout=c.describe(), dp_replicate=c.dp_replicate, dp_shard=c.dp_shard,
            tp=c.tp, pp=c.pp, virtual_stages=c.virtual_stages, micro_batch_size=c.micro_batch,
            microbatches=c.microbatches, recompute=c.recompute, step_s=p.step_s,
            tokens_per_s=p.tokens_per_s, mfu=p.mfu, memory_gib=p.memory_bytes / 2**30,
            memory_limit_gib=p.memory_limit_bytes / 2**30,
            scaling_efficiency=p.scaling_efficiency,
            usd_per_million_tokens=p.usd_per_million_tokens, reason=p.reason,
        ))
    return PlanResponse(accelerator=kind, gpus=gpus, catalog_version=CATALOG_VERSION, plans=rows)
