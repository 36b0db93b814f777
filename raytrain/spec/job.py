"""What a user writes: the JobSpec, loaded from YAML, JSON or a REST body, and what must agree
across its sections (raytrain.spec.sections holds each section)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from raytrain.core.hardware import node_shape, with_cpu_share
from raytrain.core.layout import Layout, ModelShape, Problem, check_layout, resolve_layout
from raytrain.core.planner import Candidate, ModelDims, NothingFits, Plan, Workload, evaluate, plan
from raytrain.errors import FieldError, SpecError
from raytrain.spec._base import Strict, field_error, raise_if_any
from raytrain.spec.sections import (
    CapacitySpec,
    DataSpec,
    ModelSpec,
    ParallelSpec,
    ResourcesSpec,
    TrainingSpec,
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
