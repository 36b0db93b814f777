"""The parallel layout as one value: degrees for each technique, the pipeline schedule, the
micro-batch and recomputation; resolved from a spec, searched by the planner, built by
raytrain.parallel, reported in a job's status and by POST /v1/plans.

A layout says how `world_size` ranks split the work: `dp_replicate` copies of the model (DDP,
or the replicate dimension of HSDP), each sharded `dp_shard` ways (FSDP2), each layer cut
`tp` ways (tensor parallel), and the stack of layers cut into `pp` pipeline ranks, each
holding `virtual_stages` stages (interleaved schedules). One optimizer step pushes
`microbatches` micro-batches of `micro_batch_size` samples through each data-parallel rank
(the pipeline's microbatches are the gradient-accumulation count).

A Layout checks its own values on construction (positive degrees, a known schedule and
recomputation). `check_layout` is the one feasibility check against a model (divisibility,
stages, microbatches per schedule): the spec reports its problems at the field to change,
and the planner keeps only candidates without any.

    layout, problems = resolve_layout("fsdp", world_size=8, given={"tp": 2})
    # Layout(dp_replicate=1, dp_shard=4, tp=2, pp=1, ...)
    problems += check_layout(layout, ModelShape(num_layers=2, num_heads=4, ...), ...)
    layout.describe()  # "dp_shard4 tp2 mb1x1 sequence parallel"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

# Which degree a named strategy fills with whatever the explicitly given degrees leave.
FREE_DEGREE = {
    "data": "dp_replicate",
    "fsdp": "dp_shard",
    "expert": "dp_shard",  # fully sharded, with the experts over every data rank (ep)
    "tensor": "tp",
    "pipeline": "pp",
    "hybrid": None,
}
DEGREES = ("dp_replicate", "dp_shard", "tp", "pp")


SCHEDULES = ("1f1b", "interleaved_1f1b", "gpipe")
RECOMPUTE = ("none", "selective", "full")
# What each field means, for the API's documents (the Layout and a plan's row both show them).
FIELD_DOCS = {
    "dp_replicate": "Data-parallel replicas: each holds the whole (sharded) model.",
    "dp_shard": "Data-parallel ranks that shard parameters, gradients and optimizer state "
                "(FSDP2) within a replica.",
    "tp": "Tensor-parallel degree: each layer's matmuls split across this many ranks.",
    "pp": "Pipeline-parallel degree: ranks that each hold a run of layers.",
    "virtual_stages": "Stages per pipeline rank (more than 1: interleaved schedule).",
    "micro_batch_size": "Sequences per micro-batch on each data-parallel rank.",
    "microbatches": "Micro-batches per optimizer step (accumulated, or fed to the pipeline).",
    "recompute": "Activation recomputation: none, selective or full.",
    "schedule": "Pipeline schedule: 1f1b, interleaved_1f1b or gpipe.",
    "sequence_parallel": "Norms and dropout sharded along the sequence with tensor "
                         "parallelism.",
    "reduce_scatter_once": "FSDP2 without a pipeline: gradients are reduce-scattered once per "
                           "optimizer step, on the last micro-batch, each rank holding its "
                           "unsharded fp32 gradients between micro-batches (fewer collectives, "
                           "more memory). Strategy 'auto' chooses it when it is faster and "
                           "fits.",
    "ep": "Expert-parallel degree: a mixture of experts' experts split over this many of the "
          "fully sharded data ranks, tokens exchanged by all-to-all.",
    "zero2": "FSDP2 without a pipeline: each block's parameters stay gathered from its "
             "forward to its backward (ZeRO-2: gradients and optimizer state sharded, "
             "parameters whole during the step), so the backward does not gather them again "
             "(less traffic, the whole model's parameters held). Strategy 'auto' chooses it "
             "when it is faster and fits.",
}


@dataclass(frozen=True)
class Layout:
    dp_replicate: Annotated[int, Field(description=FIELD_DOCS["dp_replicate"])] = 1
    dp_shard: Annotated[int, Field(description=FIELD_DOCS["dp_shard"])] = 1
    tp: Annotated[int, Field(description=FIELD_DOCS["tp"])] = 1
    pp: Annotated[int, Field(description=FIELD_DOCS["pp"])] = 1
    virtual_stages: Annotated[int, Field(description=FIELD_DOCS["virtual_stages"])] = 1
    micro_batch_size: Annotated[int, Field(description=FIELD_DOCS["micro_batch_size"])] = 1
    microbatches: Annotated[int, Field(description=FIELD_DOCS["microbatches"])] = 1
    recompute: Annotated[str, Field(description=FIELD_DOCS["recompute"])] = "none"
    schedule: Annotated[str, Field(description=FIELD_DOCS["schedule"])] = "1f1b"
    sequence_parallel: Annotated[bool, Field(
        description=FIELD_DOCS["sequence_parallel"])] = True
    reduce_scatter_once: Annotated[bool, Field(
        description=FIELD_DOCS["reduce_scatter_once"])] = False
    zero2: Annotated[bool, Field(description=FIELD_DOCS["zero2"])] = False
    ep: Annotated[int, Field(description=FIELD_DOCS["ep"])] = 1

    def __post_init__(self) -> None:
        for name in (*DEGREES, "virtual_stages", "micro_batch_size", "microbatches", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Layout.{name} must be a positive integer, not {value!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Layout.schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout.recompute {self.recompute!r} is not one of {RECOMPUTE}")

    # Which techniques the layout uses, by name (torchtitan's ParallelDims has the same):
    # read these rather than comparing degrees.
    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: how many different slices of each batch are read at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def gpipe(self) -> bool:
        return self.pp_enabled and self.schedule == "gpipe"

    @property
    def data_parallel_wrapper(self) -> str:
        """'fsdp' (FSDP2, HSDP when also replicated), 'ddp', or 'none'.

        DDP cannot hold tensor-parallel DTensors, and it expects one backward per forward,
        which a pipeline schedule's microbatches break, so data parallelism alongside tensor
        or pipeline parallelism is FSDP2 over a (replicate, shard) mesh even when nothing is
        sharded.
        """
        if self.dp_shard_enabled or (
                self.dp_replicate_enabled and (self.tp_enabled or self.pp_enabled)):
            return "fsdp"
        return "ddp" if self.dp_replicate_enabled else "none"

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DEGREES}

    def describe(self) -> str:
        """The layout in words, e.g. 'dp_shard2 tp2 pp2 1f1b mb2x4 recompute full sequence
        parallel': the same text wherever raytrain shows a layout."""
        parts = [f"{name}{getattr(self, name)}" for name in DEGREES if getattr(self, name) > 1]
        parts = parts or ["1 device"]
        if self.pp_enabled:
            parts.append(self.schedule + (f" v{self.virtual_stages}"
                                          if self.virtual_stages > 1 else ""))
        parts.append(f"mb{self.micro_batch_size}x{self.microbatches}")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        if self.tp_enabled and self.sequence_parallel:
            parts.append("sequence parallel")
        if self.reduce_scatter_once:
            parts.append("reduce-scatter once")
        if self.zero2:
            parts.append("zero2")
        if self.ep_enabled:
            parts.append(f"ep{self.ep}")
        return " ".join(parts)


@dataclass(frozen=True)
class ModelShape:
    """What layout checks need of the model; None where the model is the user's own."""

    num_layers: int | None = None
    num_heads: int | None = None
    hidden_dim: int | None = None  # the MLP's inner width
    num_kv_heads: int | None = None  # grouped-query attention; None: as many as num_heads
    vocab_size: int | None = None
    max_seq_len: int | None = None
    tied_embeddings: bool = False


@dataclass(frozen=True)
class Problem:
    field: tuple[str, ...]
    message: str


def one_device_shards(layout: Layout, precision: str, lora: bool) -> bool:
    """Whether a layout of one device runs under FSDP2 over a mesh of one for its precision:
    bf16's parameters (gathered, and computed, in bf16; fp32 gradients and optimizer state).
    Not with LoRA: its frozen weights are kept in bf16 already, and FSDP's unsharded copies
    of them would only add memory. The engine builds it (raytrain.parallel.parallelize) and
    the planner prices it."""
    return layout.world_size == 1 and precision == "bf16" and not lora


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges per stage, sizes differing by at most one. Where the layers do
    not divide evenly, the stages one layer short are taken from the ends inwards (the first,
    the last, the second, ...): the first stage also holds the embeddings and the most
    micro-batches in flight, the last the head and the loss. Llama 3 balances its pipeline so
    (Llama 3 Herd of Models, section 3.3.2), as torchtitan does by default."""
    base, extra = divmod(num_layers, num_stages)
    ends = [end for pair in zip(range(num_stages), reversed(range(num_stages)))
            for end in dict.fromkeys(pair)]
    short = set(ends[:num_stages - extra]) if extra else set()
    ranges, start = [], 0
    for stage in range(num_stages):
        size = base + (0 if stage in short else 1) if extra else base
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stages_of_rank(pp_rank: int, pp: int, num_stages: int) -> list[int]:
    """Stage indices on pipeline rank `pp_rank`: one, or every pp-th for interleaved ('loop')."""
    return list(range(pp_rank, num_stages, pp))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def resolve_layout(
    strategy: str,
    world_size: int,
    given: dict[str, int | None],
    virtual_stages: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
    sequence_parallel: bool = True,
    micro_batch_size: int = 1,
    recompute: str = "none",
    reduce_scatter_once: bool = False,
    zero2: bool = False,
    ep: int | None = None,
) -> tuple[Layout, list[Problem]]:
    """Fill the strategy's free degree from the given ones; report a product that is not
    `world_size` at the field a user would change."""
    degrees = {name: given.get(name) or 1 for name in DEGREES}
    free = FREE_DEGREE[strategy]
    problems: list[Problem] = []
    stated_fields = [name for name in DEGREES if given.get(name) is not None]
    at = ("parallel", stated_fields[0]) if stated_fields else ("parallel",)
    if free is not None and given.get(free) is None:
        others = 1
        for name in DEGREES:
            if name != free:
                others *= degrees[name]
        if world_size % others:
            problems.append(Problem(
                at,
                f"the given degrees multiply to {others}, which does not divide "
                f"resources.num_workers={world_size}. To fix: use degrees whose product "
                f"divides {world_size} (divisors: {divisors(world_size)})",
            ))
        degrees[free] = max(1, world_size // others)
    layout = Layout(
        **degrees,
        virtual_stages=virtual_stages,
        microbatches=microbatches,
        schedule=schedule,
        sequence_parallel=sequence_parallel,
        micro_batch_size=micro_batch_size,
        recompute=recompute,
        reduce_scatter_once=reduce_scatter_once,
        zero2=zero2,
        ep=ep or (degrees["dp_shard"] if strategy == "expert" else 1),
    )
    if not problems and layout.world_size != world_size:
        stated = " x ".join(f"{n}={degrees[n]}" for n in DEGREES if degrees[n] > 1) or "1"
        problems.append(Problem(
            at,
            f"degrees {stated} multiply to {layout.world_size} but resources.num_workers="
            f"{world_size}. To fix: set resources.num_workers to {layout.world_size}, or "
            f"change the degrees so they multiply to {world_size}"
            + (f" (with strategy '{strategy}', leave parallel.{free} out to have it filled)"
               if free else ""),
        ))
    return layout, problems


def _needs_built_in(degree: str, technique: str, why: str, instead: str) -> Problem:
    return Problem(("parallel", degree), f"{technique} needs the built-in GPT ({why}). To "
                   f"fix: use model.kind 'gpt', or strategy {instead} for your model")


def check_layout(
    layout: Layout, shape: ModelShape, seq_len: int, built_in_model: bool
) -> list[Problem]:
    """Everything that makes a layout impossible for this model, each with what would fit."""
    problems: list[Problem] = []
    if layout.reduce_scatter_once and (layout.data_parallel_wrapper != "fsdp" or layout.pp_enabled):
        problems.append(Problem(
            ("parallel", "reduce_scatter_once"),
            f"reduce_scatter_once holds back FSDP2's gradient reduce-scatter, and this layout "
            f"({layout.describe()}) has none to hold back (a pipeline reduces once per step "
            "already). To fix: set it to false, or use strategy 'fsdp' (or 'hybrid' with "
            "dp_shard > 1) without pp",
        ))
    if layout.zero2 and (layout.dp_shard == 1 or layout.pp_enabled):
        problems.append(Problem(
            ("parallel", "zero2"),
            f"zero2 keeps FSDP2's sharded parameters gathered from forward to backward, and "
            f"this layout ({layout.describe()}) " + (
                "keeps them so already (a pipeline does not reshard between micro-batches)"
                if layout.pp_enabled else "does not shard them (dp_shard is 1)")
            + ". To fix: set it to false, or use strategy 'fsdp' (or 'hybrid' with "
            "dp_shard > 1) without pp",
        ))
    if layout.pp_enabled and shape.tied_embeddings:
        problems.append(Problem(
            ("parallel", "pp"),
            "model.gpt.tie_embeddings shares the token embeddings with the output head, "
            "which a pipeline puts on its first and last stages. To fix: set "
            "tie_embeddings to false, or use a layout without pp",
        ))
    problems += _tensor_problems(layout, shape, seq_len, built_in_model)
    problems += _pipeline_problems(layout, shape, built_in_model)
    return problems


def _tensor_problems(layout: Layout, shape: ModelShape, seq_len: int, built_in_model: bool
                     ) -> list[Problem]:
    """What stops tensor parallelism: a model it cannot cut, sizes tp does not divide."""
    problems: list[Problem] = []
    if layout.tp_enabled:
        if not built_in_model:
            problems.append(_needs_built_in("tp", "tensor parallelism", "its plan cuts "
                                            "layers by name", "'fsdp' or 'data'"))
        else:
            sizes = {"num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
                     "ffn_dim (default 4 x dim)": shape.hidden_dim,
                     "vocab_size": shape.vocab_size, "max_seq_len": shape.max_seq_len}
            clashes = [f"{name}={size}" for name, size in sizes.items()
                       if size is not None and size % layout.tp]
            if clashes:
                fits = [d for d in divisors(layout.world_size)
                        if all(size is None or size % d == 0 for size in sizes.values())]
                problems.append(Problem(
                    ("parallel", "tp"),
                    f"tp={layout.tp} does not divide model.gpt {', '.join(clashes)}. To fix: "
                    f"use a tp that divides them and the worker count ({fits}), or change "
                    f"those sizes to multiples of {layout.tp}",
                ))
            if layout.sequence_parallel and seq_len % layout.tp:
                problems.append(Problem(
                    ("parallel", "sequence_parallel"),
                    f"sequence parallel splits data.seq_len={seq_len} over tp={layout.tp} "
                    f"ranks. To fix: make seq_len a multiple of {layout.tp}, or set "
                    "sequence_parallel to false",
                ))
    return problems


def _pipeline_problems(layout: Layout, shape: ModelShape, built_in_model: bool
                       ) -> list[Problem]:
    """What stops a pipeline: its schedule and stages against the model and the batch."""
    problems: list[Problem] = []
    if layout.virtual_stages > 1 and layout.schedule != "interleaved_1f1b":
        problems.append(Problem(
            ("parallel", "virtual_stages"),
            f"virtual_stages={layout.virtual_stages} needs pipeline_schedule "
            f"'interleaved_1f1b', not '{layout.schedule}'. To fix: set one or the other",
        ))
    if layout.schedule == "interleaved_1f1b" and layout.pp_enabled and layout.virtual_stages < 2:
        problems.append(Problem(
            ("parallel", "virtual_stages"),
            "pipeline_schedule 'interleaved_1f1b' needs at least 2 stages per pipeline rank. "
            "To fix: set virtual_stages to 2 or more, or use schedule '1f1b'",
        ))
    if layout.pp_enabled:
        if not built_in_model:
            problems.append(_needs_built_in("pp", "pipeline parallelism", "it is split by "
                                            "layer", "'fsdp'"))
        elif shape.num_layers is not None and layout.num_stages > shape.num_layers + 2:
            # The first stage may hold only the embeddings and the last only the head (the
            # stages a layer short are the ends': stage_layers), as Llama 3 splits its model.
            most = shape.num_layers + 2
            problems.append(Problem(
                ("parallel", "pp"),
                f"pp={layout.pp} x virtual_stages={layout.virtual_stages} = "
                f"{layout.num_stages} stages, but the model has {shape.num_layers} layers: "
                f"every stage but the first and the last needs one. To fix: use at most "
                f"{most} stages, or more layers",
            ))
        if layout.schedule != "gpipe" and layout.microbatches < layout.pp:
            problems.append(Problem(
                ("training", "global_batch_size"),
                f"{layout.schedule} with pp={layout.pp} needs at least {layout.pp} "
                f"microbatches per step, but global_batch_size / (micro_batch_size x "
                f"data-parallel ranks) = {layout.microbatches}. To fix: raise "
                f"global_batch_size to {layout.pp}x that or lower micro_batch_size",
            ))
        if layout.schedule == "interleaved_1f1b" and layout.microbatches % layout.pp:
            problems.append(Problem(
                ("training", "global_batch_size"),
                f"interleaved_1f1b needs the microbatch count ({layout.microbatches}) to be "
                f"a multiple of pp={layout.pp}. To fix: change global_batch_size or "
                "micro_batch_size so it is",
            ))
    return problems
