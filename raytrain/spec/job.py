"""What a user writes: the JobSpec, loaded from YAML, JSON or a REST body, and what must agree
across its sections (raytrain.spec.sections and raytrain.spec.resources hold each section)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from raytrain.catalog.hardware import fp8_kinds
from raytrain.errors import FieldError, SpecError
from raytrain.spec._base import Strict, field_error, raise_if_any
from raytrain.spec.fixes import with_fix
from raytrain.spec.layout import (
    DEGREES,
    Layout,
    ModelShape,
    Problem,
    check_layout,
    divisors,
    resolve_layout,
)
from raytrain.spec.model import ModelSpec
from raytrain.spec.resources import CapacitySpec, ResourcesSpec
from raytrain.spec.sections import DataSpec, ParallelSpec, TrainingSpec
from raytrain.spec.tracking import TrackingSpec


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
    tracking: TrackingSpec | None = Field(None, description=(
        "Experiment trackers that get the job's run (MLflow, W&B, TensorBoard); null: the "
        "service's default (ServiceConfig.tracking), if any."))

    @model_validator(mode="after")
    def _sections_agree(self) -> JobSpec:
        errors: list[InitErrorDetails] = []
        training, resources = self.training, self.resources
        layout, problems = self._stated()
        if layout is not None and not problems:
            problems = self.layout_problems(layout)
        for problem in problems:
            errors.append(field_error(problem.field, problem.message, None))
        if training.precision == "fp16" and not resources.use_gpu:
            errors.append(
                field_error(
                    ("training", "precision"),
                    "fp16 with loss scaling needs GPUs. To fix: use 'bf16' or 'fp32' on CPU, "
                    "or set resources.gpus_per_worker",
                    training.precision,
                )
            )
        errors.extend(_fp8_errors(self))
        if self.model.builtin and self.data.seq_len > self.model.gpt.max_seq_len:
            limit = self.model.gpt.max_seq_len
            errors.append(
                field_error(
                    ("data", "seq_len"),
                    f"seq_len={self.data.seq_len} exceeds the {limit} positions of "
                    "model.hf.path's model (its config's max_position_embeddings, or its "
                    "sliding_window: within it a window is full attention, beyond it it is "
                    f"not implemented). To fix: lower data.seq_len to at most {limit}"
                    if self.model.kind == "hf" else
                    f"seq_len={self.data.seq_len} exceeds model.gpt.max_seq_len={limit}. "
                    "To fix: lower data.seq_len or raise model.gpt.max_seq_len",
                    self.data.seq_len,
                )
            )
        raise_if_any("JobSpec", errors)
        return self

    def stated_layout(self) -> Layout | None:
        """The layout this spec states (checked on construction), or None for strategy
        'auto' on the built-in GPT, which raytrain.core.resolve plans once at submit."""
        return self._stated()[0]

    def _stated(self) -> tuple[Layout | None, list[Problem]]:
        parallel, training = self.parallel, self.training
        recompute = parallel.recompute_mode
        if parallel.strategy == "auto":
            if self.model.planned_shape is None:  # unknown: data parallel over the workers
                return self._with_batch(Layout(dp_replicate=self.resources.num_workers,
                                               recompute=recompute)), []
            if self.resources.device_kind is None:
                return None, [Problem(("resources", "accelerator"), (
                    "strategy 'auto' plans for a GPU kind. To fix: set resources.accelerator "
                    "(e.g. 'h100-sxm'), or choose a strategy"))]
            return None, []
        layout, problems = resolve_layout(
            parallel.strategy,
            self.resources.num_workers,
            {name: getattr(parallel, name) for name in DEGREES},
            virtual_stages=parallel.virtual_stages,
            schedule=parallel.pipeline_schedule,
            sequence_parallel=parallel.sequence_parallel,
            micro_batch_size=training.micro_batch_size,
            recompute=recompute,
            reduce_scatter_once=parallel.reduce_scatter_once,
            zero2=parallel.zero2,
            ep=parallel.ep,
        )
        return self._with_batch(layout), problems

    def _with_batch(self, layout: Layout) -> Layout:
        """The layout with this spec's micro-batch count (gradient accumulation) filled in."""
        training = self.training
        accum = max(1, training.global_batch_size // (training.micro_batch_size * layout.dp))
        return replace(layout, micro_batch_size=training.micro_batch_size, microbatches=accum)

    def layout_problems(self, layout: Layout) -> list[Problem]:
        """Everything that rules `layout` out for this job: the batch, the model's sizes,
        compression and precision. Empty when it trains."""
        training, parallel = self.training, self.parallel
        per_step = training.micro_batch_size * layout.dp
        if training.global_batch_size % per_step:
            fits = max(per_step, training.global_batch_size // per_step * per_step)
            return [Problem(
                ("training", "global_batch_size"),
                f"global_batch_size={training.global_batch_size} is not a multiple of "
                f"micro_batch_size x data-parallel ranks = {training.micro_batch_size}"
                f" x {layout.dp} = {per_step}. To fix: use {fits} or another multiple of "
                f"{per_step}",
            )]
        shape = ModelShape()
        if self.model.builtin:
            gpt = self.model.gpt
            shape = ModelShape(gpt.num_layers, gpt.num_heads, gpt.hidden_dim, gpt.num_kv_heads,
                               gpt.vocab_size,
                               gpt.max_seq_len if gpt.positions == "learned" else None,
                               gpt.tie_embeddings)
        problems = check_layout(layout, shape, self.data.seq_len, self.model.builtin)
        if parallel.compression != "none" and layout.data_parallel_wrapper != "ddp":
            problems.append(Problem(
                ("parallel", "compression"),
                f"gradient compression rides on DDP's communication hooks, but this layout "
                f"({layout.describe()}) uses "
                + ("FSDP2" if layout.data_parallel_wrapper == "fsdp" else "no data "
                   "parallelism")
                + ". To fix: set compression to 'none', or use data parallelism "
                "(dp_replicate > 1) without tp or dp_shard",
            ))
        if training.precision == "fp8" and layout.tp_enabled:
            problems.append(Problem(
                ("training", "precision"),
                "fp8 does not combine with tensor parallelism yet (its linears would need "
                "float8-aware sharding to scale as one process does). To fix: set tp to 1 "
                "(FSDP or pipeline parallelism scale fp8 alike), or use 'bf16'",
            ))
        if training.lora is not None:
            problems += _lora_problems(self, layout)
        if self.model.builtin and self.model.gpt.moe is not None:
            problems += _experts_problems(self, layout)
        elif layout.ep_enabled:
            problems.append(Problem(("parallel", "ep"), "expert parallelism splits a mixture "
                                    "of experts' experts, and this model has none. To fix: "
                                    "leave parallel.ep out (or 1), and strategy 'fsdp'"))
        if training.precision == "fp16" and layout.pp_enabled:
            problems.append(Problem(
                ("training", "precision"),
                "fp16 loss scaling is not wired through pipeline schedules. To fix: use "
                "'bf16' (no loss scaling needed) with pipeline parallelism",
            ))
        return problems

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.data.seq_len

    def import_paths(self) -> list[tuple[tuple[str, ...], str]]:
        """Every user import path in the spec, with its field path."""
        found: list[tuple[tuple[str, ...], str]] = []
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


def spec_error_from_validation(exc: ValidationError, source: str = "job spec",
                               model: type[BaseModel] | None = None) -> SpecError:
    """Each refused field at its path, with how to fix it (for a misspelt name in a document
    of `model`, the name probably meant)."""
    return SpecError([FieldError(tuple(err["loc"]), with_fix(err, model))  # type: ignore[arg-type]
                      for err in exc.errors()], source=source)


def parse_job_spec(document: dict[str, Any]) -> JobSpec:
    """Validate a parsed document into a JobSpec, raising SpecError with field paths."""
    if not isinstance(document, dict):
        raise SpecError([FieldError((), "a job spec must be a mapping of sections")])
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, model=JobSpec) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a JobSpec from a YAML or JSON file.

        spec = load_job_spec("examples/demo.yaml")
    """
    return parse_job_spec(read_document(Path(path), "job spec"))


def read_document(path: Path, what: str) -> dict[str, Any]:
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


def _fp8_errors(spec: JobSpec) -> list[InitErrorDetails]:
    """precision fp8 on a GPU kind without FP8 tensor cores cannot run (torch's scaled
    matmul needs them), and on GPUs it runs compiled only; on CPU it is emulated (eager or
    compiled), for tests."""
    resources = spec.resources
    kind = resources.accelerator
    if spec.training.precision != "fp8" or not resources.use_gpu:
        return []
    if spec.training.compile is False:  # eager float8 is slower than bf16 (BENCHMARKS)
        return [field_error(
            ("training", "compile"),
            "fp8 on GPUs pays only under torch.compile, which fuses its scaling and casts "
            "(eager, it measured 2.3x slower than bf16 on an H200). To fix: leave "
            "training.compile unset or true, or use precision 'bf16'", False)]
    able = fp8_kinds()
    if kind is None or kind in able:
        return []
    return [field_error(
        ("training", "precision"),
        f"fp8 needs GPUs with FP8 tensor cores, and resources.accelerator is {kind}. To fix: "
        f"use 'bf16', or set resources.accelerator to one of {', '.join(able)}",
        "fp8",
    )]


def _experts_problems(spec: JobSpec, layout: Layout) -> list[Problem]:
    """What a mixture of experts does not combine with (yet), each with the fix."""
    problems = []
    for degree, name in ((layout.tp, "tp"), (layout.pp, "pp")):
        if degree > 1:
            problems.append(Problem(("parallel", name), f"a mixture of experts trains under "
                                    f"data parallelism or FSDP, not {name}={degree} "
                                    f"({layout.describe()}). To fix: set parallel.strategy to "
                                    "'data' or 'fsdp'"))
    experts = spec.model.gpt.moe.num_experts if spec.model.gpt.moe is not None else 1
    if layout.ep_enabled and (layout.dp_shard % layout.ep or experts % layout.ep):
        fits = [d for d in divisors(layout.dp_shard) if experts % d == 0]
        problems.append(Problem(("parallel", "ep"), f"ep={layout.ep} must divide the fully "
                                f"sharded ranks (dp_shard={layout.dp_shard}), which it reuses, "
                                f"and the {experts} experts, which it splits. To fix: use one "
                                f"of {fits}"))
    if layout.ep_enabled and layout.dp_replicate_enabled:
        problems.append(Problem(("parallel", "ep"), "expert parallelism runs within one "
                                "fully sharded replica (dp_replicate 1). To fix: set "
                                "dp_replicate to 1, or ep to 1"))
    moe = spec.model.gpt.moe
    rate = spec.training.moe.bias_update_rate if spec.training.moe is not None else None
    if moe is not None and moe.score_bias and rate != 0 and layout.dp_replicate_enabled and \
            spec.parallel.elastic:
        problems.append(Problem(("training", "moe", "bias_update_rate"), "the experts' bias "
                                "moves with every replica group's routing, which elastic "
                                "replica groups do not share. To fix: set it to 0, set "
                                "parallel.elastic to false, or use strategy 'fsdp' or "
                                "'expert'"))
    if spec.training.precision == "fp8":
        problems.append(Problem(("training", "precision"), "float8 is not applied to the "
                                "experts' packed weights. To fix: use 'bf16'"))
    if spec.training.lora is not None and {"gate_proj", "up_proj", "down_proj"} & set(
            spec.training.lora.targets):
        problems.append(Problem(("training", "lora", "targets"), "adapters on the experts' "
                                "projections are not implemented; the experts stay frozen. "
                                "To fix: target the attention's q_proj, k_proj, v_proj, "
                                "o_proj"))
    return problems


def _lora_problems(spec: JobSpec, layout: Layout) -> list[Problem]:
    """What training.lora does not combine with, each with the fix."""
    here, problems = ("training", "lora"), []
    if not spec.model.builtin:
        problems.append(Problem(here, "adapters are put on the built-in model's linears "
                                "(kind 'gpt' or 'hf'). To fix: train a Hugging Face folder "
                                "as model.kind 'hf', or apply PEFT in your own factory"))
    if layout.tp_enabled or layout.pp_enabled:
        problems.append(Problem(here, f"adapters train under data parallelism or FSDP, not "
                                f"this layout ({layout.describe()}). To fix: set "
                                "parallel.strategy to 'data' or 'fsdp'"))
    if spec.training.precision == "fp8":
        problems.append(Problem(here, "float8 linears do not carry adapters. To fix: use "
                                "training.precision 'bf16'"))
    lora = spec.training.lora
    if lora is not None and spec.model.builtin and spec.model.gpt.mlp != "swiglu" and (
            {"gate_proj", "up_proj"} & set(lora.targets)):
        problems.append(Problem(here, "gate_proj and up_proj are a gated MLP's (SwiGLU); "
                                "this model's MLP is not. To fix: target down_proj or the "
                                "attention's linears"))
    return problems
