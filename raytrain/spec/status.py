"""What the service answers about a job: its state, progress, resources, plan, checkpoints,
preemptions, result and events."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import AliasChoices, Field, model_validator

from raytrain.spec._base import Record
from raytrain.spec.job import JobSpec
from raytrain.spec.layout import Layout
from raytrain.spec.offers import DecisionRecord
from raytrain.spec.tracking import TrackingState


class JobState(str, Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:  # print(status.state) shows SUCCEEDED, as the API does
        return self.value

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Progress(Record):
    step: int = Field(0, description="Optimizer steps completed.")
    total_steps: int = Field(0, description="Optimizer steps the job will run.")
    loss: float | None = Field(None, description="Training loss of the latest step.")
    first_loss: float | None = Field(None, description="Training loss of the first step.")
    tokens_per_s: float | None = Field(None, description="Recent training throughput.")
    step_s: float | None = Field(
        None, description="Recent seconds per optimizer step, checkpoint saves left out (what "
        "the plan's predicted_step_s is compared with).")
    elapsed_s: float = Field(0.0, description="Seconds since training started.")
    eta_s: float | None = Field(None, description="Estimated seconds to finish.")
    groups: int | None = Field(None, description=(
        "Elastic jobs: the replica groups that took part in the latest step reported (null: "
        "not an elastic job)."))
    val_loss: float | None = Field(None, description=(
        "The latest validation loss (data.validation), measured at val_step."))
    balance_loss: float | None = Field(None, description=(
        "A mixture of experts: the router's load-balancing loss of the latest step (rank 0's "
        "micro-batches), kept apart from `loss`, which is the language model's; null for a "
        "dense model."))
    expert_imbalance: float | None = Field(None, description=(
        "A mixture of experts: the busiest expert's tokens over the mean in the latest step "
        "(1: perfectly balanced), at its most unbalanced block."))
    val_step: int | None = Field(None, description="The step val_loss was measured after.")
    val_perplexity: float | None = Field(None, description=(
        "exp(val_loss): the validation perplexity (null without a validation loss)."))
    eval_s: float | None = Field(None, description=(
        "Seconds the latest validation took (left out of step_s)."))
    data_s: float | None = Field(None, description=(
        "Recent seconds a step waited for its data (left out of step_s; read ahead on a "
        "thread, so near 0 unless the data is slower than the step)."))
    warmup_s: float | None = Field(None, description=(
        "Seconds compiling took (training.compile), left out of step_s, tokens_per_s and "
        "the ETA."))
    mfu: float | None = Field(None, description=(
        "Model FLOPs utilisation of the recent throughput: tokens/s times the model's FLOPs "
        "per token as the planner counts them, over the devices' peak at the job's "
        "precision (null: the model's shape or the device is not known)."))
    fsdp_units: str | None = Field(None, max_length=500, description=(
        "What FSDP shards one unit at a time, e.g. '4 x LlamaDecoderLayer, then the rest at "
        "the root' (null: no FSDP)."))
    left_out: str | None = Field(None, max_length=500, description=(
        "What of the model's checkpoint the run does not train (DeepSeek-V3's multi-token "
        "prediction layers); null: nothing."))


class Resources(Record):
    accelerator: str = Field("cpu", description="The accelerator kind the workers run on.")
    node_type: str | None = Field(None, description="The Ray node type, when autoscaled.")
    offer: str | None = Field(None, description="The offer bought, when autoscaled.")
    market: Literal["local", "spot", "on-demand"] = Field("local", description="How bought.")
    nodes: int = Field(0, description="Nodes the workers span.")
    gpus: float = Field(0, description="GPUs held by the job.")
    cpus: float = Field(0, description="CPUs held by the job.")
    usd_per_hour: float = Field(
        0.0, description="Price of the held capacity per hour.",
        validation_alias=AliasChoices("usd_per_hour", "hourly_usd"),  # stores before 2026-12
    )


class PlanSummary(Record):
    strategy: str = Field(description="The parallel strategy.")
    layout: Layout = Field(description="The layout the job trains with: degrees, schedule, "
                           "micro-batch and recomputation.")
    description: str = Field("", description="The layout in words, e.g. 'dp_shard2 tp2'.")
    predicted_step_s: float | None = Field(None, description="The planner's step time.")
    predicted_tokens_per_s: float | None = Field(None, description="The planner's throughput.")
    predicted_memory_gib: float | None = Field(
        None, description="The planner's memory per device (weights, gradients, optimizer "
        "state, activations)."
    )
    measured_step_s: float | None = Field(
        None, description="Seconds per step from the latest progress report, checkpoint "
        "saves left out, once running."
    )
    reason: str | None = Field(None, description="The planner's one-line account of the plan.")
    grad_accum_steps: int = Field(description="Micro-batches accumulated per optimizer step.")
    tokens_per_step: int = Field(description="Tokens per optimizer step, all ranks.")
    backend: str = Field(description="Collective backend: nccl on GPU, gloo on CPU.")
    catalog_version: str | None = Field(
        None, description="The hardware catalog the plan was made with.")


class CheckpointInfo(Record):
    step: int = Field(description="Optimizer steps the checkpoint includes.")
    path: str = Field(description="Directory of the checkpoint.")
    save_s: float | None = Field(None, description="Seconds training stalled for it (the "
                                 "copy to host memory; null: not measured).")
    durable_s: float | None = Field(None, description="Seconds from the save's start until "
                                    "every shard was stored and the checkpoint committed.")
    committed_at: float | None = Field(None, description="When it was committed (Unix "
                                       "time); the status warns when that grows old.")


class CostFigure(Record):
    """One figure the policy prices checkpoints and preemptions with: what the policy file
    assumes, what the service has measured, and the one the policy uses (the measured one,
    once there is one)."""

    assumed_s: float | None = Field(None, description="The policy's assumption, in seconds.")
    measured_s: float | None = Field(None, description="The service's measurement (null: "
                                     "none yet): the latest for a checkpoint, the mean for "
                                     "the others.")
    samples: int = Field(0, description="How many measurements it rests on.")
    used_s: float | None = Field(None, description="The figure the policy's latest decision "
                                 "used.")


class JobCosts(Record):
    """What the job's checkpoints and restarts cost, measured against assumed."""

    checkpoint_stall_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Seconds one checkpoint stops training (the checkpoint interval is priced on it)."))
    checkpoint_durable_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Seconds from a checkpoint's start to its being durable (what a notice must cover)."))
    restart_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Seconds from capacity in hand to the first training step, over the job's starts."))
    ready_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Seconds from asking for nodes to their being up, for the offer the job holds (the "
        "service's measurement across its jobs)."))
    group_stall_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Elastic jobs: seconds the surviving replica groups stall when one leaves or joins."))
    replace_s: CostFigure = Field(default_factory=CostFigure, description=(
        "Elastic jobs: seconds from losing a replica group to its replacement training."))


class GroupStatus(Record):
    """One data-parallel replica group of an elastic job (parallel.elastic)."""

    index: int = Field(description="The group's place among the job's replica groups.")
    state: Literal["training", "leaving", "healing", "gone"] = Field(description=(
        "training; leaving (its node is being taken: it leaves at a step boundary); "
        "healing (a replacement taking the weights from a live group); gone (lost, a "
        "replacement is on its way)."))
    nodes: list[str] = Field(default_factory=list, description="Its nodes (Ray node ids).")
    since: float = Field(description="Unix time it entered that state.")


class PreemptionRecord(Record):
    time: float = Field(description="Unix time the workers stopped (or were lost).")
    notice: bool = Field(description="Whether an interruption notice came first.")
    group: int | None = Field(None, description="The replica group lost, when the others "
                              "trained on (null: the whole job stopped).")
    survivors: int | None = Field(None, description="Replica groups that trained on.")
    stall_s: float | None = Field(None, description="How long the survivors stalled for the "
                                  "loss (the quorum without the lost group).")
    replaced_after_s: float | None = Field(None, description="From the loss to the "
                                           "replacement group training.")
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


class JobResult(Record):
    first_loss: float = Field(description="Loss of the first step of the job.")
    final_loss: float = Field(description="Loss of the last step.")
    steps: int = Field(description="Optimizer steps completed.")
    train_wall_s: float = Field(description="Seconds of the final training attempt.")
    tokens_per_s: float = Field(description="Mean throughput of the final attempt.")


class Bill(Record):
    """What a job's bill rests on, kept with it so that a restarted service bills on from
    where it was (as the cloud does): the nodes it holds, each since when and at what price,
    and the dollars of the nodes it let go."""

    held: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Each node it holds: [held since (unix time), "
        "dollars per node-hour].")
    closed_usd: float = Field(0.0, description="Dollars of the nodes it has let go.")


class JobStatus(Record):
    """A job as the service knows it."""

    @model_validator(mode="before")
    @classmethod
    def _bill_of_an_older_record(cls, data: Any) -> Any:
        """A record stored before bills were kept: what it cost so far stays closed."""
        if isinstance(data, dict) and "bill" not in data and data.get("cost_usd"):
            data = {**data, "bill": {"closed_usd": data["cost_usd"]}}
        return data

    id: str = Field(description="The job's id, as the service gave it at submit.")
    state: JobState = Field(description="PENDING, PROVISIONING, RUNNING, RECOVERING, then "
                            "SUCCEEDED, FAILED or CANCELLED.")
    spec: JobSpec = Field(description="The job as submitted, with defaults filled in.")
    plan: PlanSummary | None = Field(None, description="The layout the job trains with, "
                                     "decided at submit (null: the user's own model with a "
                                     "stated strategy only).")
    progress: Progress = Field(default_factory=Progress, description="Training progress.")
    resources: Resources = Field(default_factory=Resources,
                                 description="The capacity the job holds or last held.")
    cost_usd: float = Field(0.0, description="Dollars spent so far (0 on a fixed cluster): "
                            "bill.closed_usd plus each held node's price since it was held.")
    bill: Bill = Field(default_factory=Bill, description="What cost_usd is computed from.")
    restarts: int = Field(0, description="Times training restarted from a checkpoint.")
    submitted_by: str | None = Field(
        None, description="Name of the token that submitted the job (None: an open service).")
    idempotency_key: str | None = Field(
        None, description="The Idempotency-Key it was submitted with, if any.")
    preemptions: int = Field(0, description="Spot preemptions survived.")
    error: str | None = Field(None, description="Why the job failed; null unless FAILED.")
    message: str | None = Field(None, description="What the job waits for, when it waits.")
    warning: str | None = Field(None, description="What a user should know while the job "
                                "runs: its last durable checkpoint is getting old.")
    tracking: TrackingState | None = Field(None, description=(
        "Its runs in the trackers of spec.tracking, with links, and a warning while one does "
        "not take them."))
    checkpoint: CheckpointInfo | None = Field(None, description="The latest durable checkpoint.")
    decisions: list[DecisionRecord] = Field(
        default_factory=list, description="The autoscaling policy's decisions, with reasons."
    )
    preemption_log: list[PreemptionRecord] = Field(
        default_factory=list, description="Every preemption survived: what it cost."
    )
    groups: list[GroupStatus] = Field(
        default_factory=list, description="Each replica group of an elastic job that "
        "continues on survivors (empty otherwise): training, leaving, healing or gone.")
    lost_steps: int = Field(0, description="Steps redone after preemptions, all of them.")
    down_s: float = Field(0.0, description="Seconds not training after preemptions, in all.")
    preemption_cost_usd: float = Field(
        0.0, description="What the preemptions cost in all (nodes held while down, redone "
        "steps).")
    reference_usd: float | None = Field(None, description=(
        "What the cheapest on-demand capacity was expected to cost from the job's start: "
        "the reference of the policy's regret cap (null: no on-demand offer, or not "
        "autoscaled)."))
    costs: JobCosts = Field(default_factory=JobCosts, description=(
        "The checkpoint stall, checkpoint durability, restart and node-ready times: measured "
        "beside what the policy assumed, and the figure its decisions use."))
    result: JobResult | None = Field(None, description="Final figures once SUCCEEDED.")
    created_at: float = Field(description="Unix time of submission.")
    started_at: float | None = Field(None, description="Unix time training first started.")
    finished_at: float | None = Field(None, description="Unix time the job ended.")


class JobEvent(Record):
    seq: int = Field(description="Position in the job's event stream, from 0.")
    type: Literal["state", "progress", "checkpoint", "preemption", "group", "end"] = Field(
        description="state: {state, message}; progress: Progress's fields, sent_at, "
        "cost_usd and usd_per_hour; checkpoint: {step, path, save_s, durable_s}, once "
        "committed; preemption: a "
        "PreemptionRecord; group: a GroupStatus (an elastic job's replica group left, "
        "healed or joined); end: {state, error}.")
    job_id: str = Field(description="The job.")
    time: float = Field(description="Unix time the service recorded it.")
    data: dict[str, Any] = Field(default_factory=dict, description="What happened; by type.")


class ProgressPoint(Record):
    """One progress report, as a chart draws it."""

    n: int = Field(description="The report's number in the job, from 0 (gaps: thinned out).")
    time: float = Field(description="Unix time the service recorded the report.")
    step: int = Field(description="Optimizer steps completed (lower after a restart from an "
                      "older checkpoint: the steps since were redone).")
    loss: float | None = Field(None, description="Training loss of that step.")
    tokens_per_s: float | None = Field(None, description="Training throughput then.")
    cost_usd: float = Field(0.0, description="Dollars spent by then.")
    usd_per_hour: float = Field(0.0, description="Hourly price of the capacity held then.")
    val_loss: float | None = Field(None, description="The latest validation loss then.")
    val_step: int | None = Field(None, description="The step val_loss was measured after.")
    mfu: float | None = Field(None, description="Model FLOPs utilization then.")
    balance_loss: float | None = Field(None, description="A mixture of experts' "
                                       "load-balancing loss then.")
    expert_imbalance: float | None = Field(None, description="Its busiest expert's tokens "
                                           "over the mean then.")


class StepRecord(Record):
    """One optimizer step, as rank 0 measured it."""

    step: int = Field(description="The step's number, from 1 (a step done again after a "
                      "restart from an older checkpoint replaces its row).")
    loss: float | None = Field(None, description="The step's training loss: the mean over "
                               "its global batch, before the step's update.")
    lr: float | None = Field(None, description="The learning rate the step's update used.")
    grad_norm: float | None = Field(None, description="The global gradient norm before "
                                    "clipping.")
    tokens: int | None = Field(None, description="Tokens the step trained on.")


class JobHistory(Record):
    """A job's progress reports, oldest first, kept across service restarts: every one, or
    past `points_kept` of them every 2nd, 4th, ... from the first, and the latest."""

    job_id: str = Field(description="The job.")
    points_kept: int = Field(description="The most points kept per job.")
    points: list[ProgressPoint] = Field(description="The reports, oldest first.")
    steps: list[StepRecord] = Field(default_factory=list, description=(
        "Every optimizer step's figures, by step (the first `max_steps` after `after_step`)."))
    next_after_step: int | None = Field(None, description=(
        "More step rows follow: ask again with after_step set to this (null: no more)."))


class RankLog(Record):
    """One rank's output, from `offset - len(text)` bytes into its log file."""

    rank: int = Field(description="The worker's rank.")
    text: str = Field(description="What the rank wrote (stdout and stderr), UTF-8.")
    offset: int = Field(description="Where the next read of this rank starts; send it back "
                        "as `offset=RANK:BYTE` to follow.")
    size: int = Field(description="The rank's log file's size now, in bytes.")
    skipped: int = Field(description="Bytes left out between the asked offset and the text "
                         "(more than one answer holds, or the file rotated).")


class JobLogs(Record):
    """Each worker's output, kept with the job under <storage>/<job id>/logs/ (at most 8 MiB
    per rank: 4 MiB and the file before it)."""

    job_id: str = Field(description="The job.")
    state: str = Field(description="The job's state when read; follow until it ends.")
    ranks: list[RankLog] = Field(description="One entry per rank that wrote anything.")
