"""A Weights & Biases run per job, through W&B's own SDK (`wandb`, installed with
`pip install 'raytrain[tracking]'`): `wandb.init` with the job's id for the run's (so a
restarted service resumes the same run), the job's parameters as the run's config, each
metric logged at its step (a metric of the run's own, `raytrain/step`, as W&B's
define_metric sets one up: a point that arrives late lands at its step), the job's state in
the run's summary, and `finish` with the exit code of how the job ended. Offline runs are
written under the service's state folder (`tracking/wandb/`), for `wandb sync` later.

The API key comes from the service (WANDB_API_KEY, from its environment or its credentials
file), handed to the run's settings; the run prints nothing to the service's log.

    tracker = WandbTracker(spec.tracking.wandb, credentials, folder)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from raytrain.serve.tracking.metrics import Metric, params_of
from raytrain.spec import JobStatus
from raytrain.spec.tracking import TrackedRun, WandbSpec

STEP_METRIC = "raytrain/step"  # the x-axis of every metric: the job's optimizer step


class WandbTracker:
    name = "wandb"

    def __init__(self, spec: WandbSpec, credentials: Mapping[str, str], folder: Path) -> None:
        self.spec, self.folder = spec, folder
        self.api_key = credentials.get("WANDB_API_KEY")
        self.run: Any = None

    def open(self, job: JobStatus, run: TrackedRun, resumes: str | None) -> TrackedRun:
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                  **({"api_key": self.api_key} if self.api_key else {}))
        run_id = run.run_id or job.id
        self.run = wandb.init(
            project=self.spec.project, entity=self.spec.entity, mode=self.spec.mode,
            id=run_id, name=f"{job.spec.name}-{job.id}", dir=str(self.folder),
            resume="allow", reinit="create_new", settings=settings,
            config={**params_of(job), **({"raytrain.resumes_run": resumes} if resumes else {})})
        # Every metric is plotted against the job's step, a value it carries: W&B's own
        # step only grows, and drops what is logged below it (a validation loss that
        # arrives after later steps, the steps a restarted run does again).
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)
        url = self.run.url if self.spec.mode == "online" else str(self.run.dir)
        return run.model_copy(update={"run_id": run_id, "url": url})

    def log(self, run: TrackedRun, metrics: list[Metric]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for metric in metrics:
            by_step.setdefault(metric.step, {})[metric.key] = metric.value
        for step in sorted(by_step):
            self.run.log({**by_step[step], STEP_METRIC: step})

    def tag(self, run: TrackedRun, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.run.summary[key] = value

    def end(self, run: TrackedRun, status: str, at: float) -> None:
        self.run.summary["raytrain.ended"] = status
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.run = None

    def upload(self, run: TrackedRun, folder: Path, name: str) -> bool:
        return False  # the model stays where the job wrote it: the run's summary names it

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
