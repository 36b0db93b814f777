"""raytrain: train PyTorch models across many GPUs as cheaply as possible, on Ray.

    from raytrain import Client, load_job_spec
    job = Client("http://127.0.0.1:8000").submit(load_job_spec("examples/demo.yaml"))
    status = job.wait(progress=True)
"""

from __future__ import annotations

__version__ = "0.1.0"

from raytrain.client import Client, Job
from raytrain.errors import (
    JobNotFoundError,
    JobStateError,
    RaytrainError,
    ServiceError,
    ServiceUnreachableError,
    SpecError,
    TrainingError,
)
from raytrain.spec import (
    JobEvent,
    JobSpec,
    JobState,
    JobStatus,
    ServiceConfig,
    load_job_spec,
    parse_job_spec,
)

__all__ = [
    "Client",
    "Job",
    "JobEvent",
    "JobNotFoundError",
    "JobSpec",
    "JobState",
    "JobStateError",
    "JobStatus",
    "RaytrainError",
    "ServiceConfig",
    "ServiceError",
    "ServiceUnreachableError",
    "SpecError",
    "TrainingError",
    "__version__",
    "load_job_spec",
    "parse_job_spec",
]
