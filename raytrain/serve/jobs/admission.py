"""What a submit is refused for before anything is queued, beyond its spec: a retried
request (the same Idempotency-Key from the same caller within a day returns the first job,
or 409 if the spec differs), and a service already holding `max_active_jobs` queued or
running jobs (429, with the seconds after which to retry).

    earlier = check_admission(records, spec, caller, key, now, max_active=1000)
    # None: queue it; a job: the one this key queued before; else it raises why not
    new_job(spec, plan, caller, key, now)  # the record of an admitted job, PENDING
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from raytrain.cloud.object_store import checkpoint_committed, is_remote
from raytrain.core.lifecycle import Record
from raytrain.core.queue import never_fits
from raytrain.core.shuffle import held_out_windows
from raytrain.data.shards import read_index
from raytrain.errors import FieldError, JobStateError, ServiceBusyError, SpecError
from raytrain.spec import JobSpec, JobState, JobStatus, PlanSummary, Progress, parse_job_spec
from raytrain.spec.local_paths import relative_hint

IDEMPOTENCY_WINDOW_S = 24 * 3600.0
BUSY_RETRY_AFTER_S = 30


def new_job(spec: JobSpec, plan: PlanSummary, caller: str | None, key: str | None,
            now: float) -> JobStatus:
    """The record of a job just admitted: PENDING, with a new id."""
    return JobStatus(id=uuid.uuid4().hex[:12], state=JobState.PENDING, spec=spec, plan=plan,
                     progress=Progress(total_steps=spec.training.steps), message="queued",
                     created_at=now, submitted_by=caller, idempotency_key=key)


def check_admission(records: Iterable[Record], spec: JobSpec, caller: str | None,
                    key: str | None, now: float, max_active: int) -> JobStatus | None:
    """None if the job may be queued; the job this caller's `key` queued before, if it did;
    else JobStateError (the key came with another spec) or ServiceBusyError."""
    records = list(records)
    earlier = keyed_earlier(records, spec, caller, key, now)
    if earlier is not None:
        return earlier
    active = sum(1 for r in records if not r.status.state.is_terminal)
    if active >= max_active:
        raise ServiceBusyError(
            f"{active} jobs are queued or running, this service's limit (max_active_jobs="
            f"{max_active}). To fix: retry after some end, or ask its operator to raise "
            "max_active_jobs", BUSY_RETRY_AFTER_S)
    return None


def keyed_earlier(records: Iterable[Record], spec: JobSpec, caller: str | None,
                  key: str | None, now: float) -> JobStatus | None:
    """The job this caller's `key` queued within IDEMPOTENCY_WINDOW_S, if any (a retried
    request); JobStateError if that key came with another spec."""
    if key is None:
        return None
    for record in records:
        job = record.status
        if job.idempotency_key == key and job.submitted_by == caller and \
                now - job.created_at < IDEMPOTENCY_WINDOW_S:
            if job.spec != spec:
                raise JobStateError(
                    f"Idempotency-Key {key!r} was used for job {job.id} with a different "
                    "spec. To fix: send a new key for a new job")
            return job
    return None


def check_not_resumed(job: JobStatus, jobs: Iterable[JobStatus]) -> None:
    """JobStateError if a job resumed from `job`'s checkpoint is still queued or running:
    resuming it again would train the same steps twice, on two bills."""
    path = job.checkpoint.path if job.checkpoint else None
    for other in jobs:
        if path and other.id != job.id and other.spec.training.resume_from == path and \
                not other.state.is_terminal:
            raise JobStateError(
                f"job {job.id} was already resumed as job {other.id} ({other.state.value}). "
                f"To fix: follow {other.id} (raytrain status {other.id}), or cancel it before "
                "resuming again")


def resumed(job: JobStatus, budget_usd: float | None) -> JobSpec:
    """The spec of a new job that goes on from where `job` stopped (its latest checkpoint),
    with its own budget if given (validated: the budget is new input); JobStateError if
    `job` cannot be resumed."""
    if job.state not in (JobState.FAILED, JobState.CANCELLED):
        raise JobStateError(
            f"job {job.id} is {job.state.value}; only a failed or cancelled job can be "
            "resumed. To fix: wait for it to end, or cancel it first")
    if job.checkpoint is None:
        raise JobStateError(
            f"job {job.id} ended before its first checkpoint: there is nothing to resume "
            "from. To fix: submit its spec again")
    spec = job.spec.model_dump(mode="json")
    spec["training"]["resume_from"] = job.checkpoint.path
    if budget_usd is not None:
        spec["capacity"]["budget_usd"] = budget_usd
    return parse_job_spec(spec)


def check_deletable(record: Record, jobs: Iterable[JobStatus]) -> None:
    """JobStateError if a job may not be deleted yet: it has not ended, or a job resumed
    from its checkpoint still reads it (it has none of its own yet)."""
    job = record.status
    if not job.state.is_terminal or record.run is not None:
        raise JobStateError(
            f"job {job.id} is {job.state.value}; only an ended job can be deleted. To fix: "
            f"cancel it first (raytrain cancel {job.id}), then delete it")
    path = job.checkpoint.path if job.checkpoint else None
    for other in jobs:
        if path and other.spec.training.resume_from == path and other.checkpoint is None \
                and not other.state.is_terminal:
            raise JobStateError(
                f"job {other.id} goes on from job {job.id}'s checkpoint and has none of its "
                f"own yet. To fix: delete {job.id} once {other.id} has checkpointed or ended")


def check_paths_on_head_node(spec: JobSpec, endpoint: str | None = None) -> None:
    """Refuse at submit a token file that does not exist where the service runs (the head
    node: on a cluster it must be on storage every node mounts, the head node included), or
    a checkpoint to resume from that is not committed where it lives: a folder the service
    mounts, or a bucket (any bucket or prefix the service's credentials read; `endpoint`:
    the service's S3 endpoint)."""
    resume = spec.training.resume_from
    if resume:
        where, why = checkpoint_committed(resume, endpoint)
        if not where:
            raise SpecError([FieldError(("training", "resume_from"), (
                f"{resume} is not a committed checkpoint the service can read ({why}). To "
                "fix: give the checkpoint.path of an ended job, on storage every node reaches "
                "(a folder they mount, or a bucket their credentials read)"))])
    source = spec.model.hf
    if source is not None and source.weights == "pretrained":
        from raytrain.models.hf import check_folder  # torch: for these jobs only

        check_folder(spec.model.gpt, source.path)  # each tensor's shape, from its header
    if spec.data.kind == "token_file" and spec.data.path and (
            is_remote(spec.data.path) or Path(spec.data.path).expanduser().is_dir()):
        index = read_index(spec.data.path if is_remote(spec.data.path)
                           else Path(spec.data.path).expanduser(), endpoint)
        if index.get("tokens", 0) < spec.data.seq_len + 1:
            raise SpecError([FieldError(("data", "path"), (
                f"{spec.data.path} holds {index.get('tokens', 0)} tokens, fewer than seq_len "
                f"+ 1 = {spec.data.seq_len + 1}. To fix: lower data.seq_len or prepare more"))])
        _check_held_out(spec, int(index.get("tokens", 0)))
    elif spec.data.kind == "token_file" and spec.data.path:
        path = Path(spec.data.path).expanduser()
        if not path.is_file():
            raise SpecError([FieldError(("data", "path"), (
                f"{spec.data.path} is not a readable file on the service's node"
                f"{' (it does not exist)' if not path.exists() else ''}"
                f"{relative_hint(spec.data.path)}. To fix: give the absolute path of a token "
                "file on storage every node mounts"))])
        tokens = path.stat().st_size // {"uint16": 2, "uint32": 4}[spec.data.dtype]
        if tokens < spec.data.seq_len + 1:  # no window to train on: found here, not by a worker
            raise SpecError([FieldError(("data", "path"), (
                f"{spec.data.path} holds {tokens} tokens, fewer than seq_len + 1 = "
                f"{spec.data.seq_len + 1}. To fix: lower data.seq_len or give a longer file"))])
        _check_held_out(spec, tokens)


def _check_held_out(spec: JobSpec, tokens: int) -> None:
    """A validation share that would leave no window to train on is refused here, not by
    every worker as it starts."""
    validation = spec.data.validation
    if validation is not None and validation.fraction is not None:
        held_out_windows((tokens - 1) // spec.data.seq_len, validation.fraction)


def check_cpu_precision(spec: JobSpec, float8_unsupported: Callable[[], str | None]) -> None:
    """Refuse at submit an fp8 job on CPU workers when this node's CPU cannot run float8
    matmuls (`float8_unsupported()`: why not, or None; asked only for such a job): its
    workers would each fail in their first step. CPU workers are this node's kind (the
    local cluster, or CPU nodes of the same machine type)."""
    if spec.training.precision != "fp8" or spec.resources.use_gpu:
        return
    why = float8_unsupported()
    if why is not None:
        from raytrain.parallel.float8 import cpu_float8_refusal

        raise SpecError([FieldError(("training", "precision"), cpu_float8_refusal(why))])


def check_fits_the_cluster(spec: JobSpec, nodes: Any) -> None:
    """On a fixed cluster (`nodes`: each node's resources), refuse a worker group that could
    never start (it would wait in the queue forever, and everything behind it with it)."""
    resources = spec.resources
    per_worker = {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker}
    reason = never_fits(resources.num_workers, per_worker, nodes)
    if reason is not None:
        raise SpecError([FieldError(("resources", "num_workers"), reason)])
