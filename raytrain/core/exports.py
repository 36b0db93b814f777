"""Which committed checkpoint of a job an export writes: the latest, or the one of a step
the user names, found beside it by the checkpoint folders' naming (`step_<N>`, 9 digits);
the refusals name the field and the fix. Used where the command runs (`raytrain export`)
and by the job manager (`POST /v1/jobs/{id}/export`); whether that folder is committed is
the export's to check, where the storage is in reach.

    step, ref = checkpoint_to_export(status, step=None)   # (400, "s3://.../step_000000400")
"""

from __future__ import annotations

from raytrain.errors import FieldError, JobStateError, SpecError
from raytrain.spec import JobStatus


def checkpoint_to_export(status: JobStatus, step: int | None) -> tuple[int, str]:
    """(step, checkpoint ref) of the job's checkpoint to export (module doc)."""
    if status.spec.model.hf is None:
        raise SpecError([FieldError(("model", "kind"), (
            "only a kind 'hf' job's checkpoints are written as a Hugging Face folder (its "
            "config.json comes from model.hf.path). To fix: export a job of kind 'hf'"))])
    latest = status.checkpoint
    if latest is None:
        raise JobStateError(f"job {status.id} has no checkpoint yet. To fix: export it once "
                            "`raytrain status` shows one")
    if step is None or step == latest.step:
        return latest.step, latest.path
    if step < 1:
        raise SpecError([FieldError(("step",), f"{step}: steps count from 1. To fix: give a "
                                    "step `raytrain status` lists as checkpointed")])
    parent = latest.path.rstrip("/").rpartition("/")[0]
    return step, f"{parent}/step_{step:09d}"
