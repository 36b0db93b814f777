"""A job's training run, as its runner starts it: one `TorchTrainer.fit()` for a rigid job
(raytrain.train.launcher), or one per replica group for a job whose groups outlive each other
(raytrain.train.elastic_launcher). Both launchers share the rigid one's pieces, so the choice
between them lives here, above both.

    run_training_job(spec, layout, job_id="ab12", checkpoint_root="...", run_root=Path(...),
                     manager=("raytrain", "raytrain-job-manager"))
"""

from __future__ import annotations

import os
from pathlib import Path

from raytrain.core.elastic import run_groups
from raytrain.spec import JobSpec, Layout
from raytrain.train.elastic_launcher import run_elastic_job
from raytrain.train.launcher import build_trainer


def run_training_job(
    spec: JobSpec, layout: Layout, job_id: str, checkpoint_root: str, run_root: Path,
    manager: tuple[str, str], worker_resources: dict[str, float] | None = None,
    interruption_endpoint: str | None = None,
) -> None:
    """Block until the job's training finishes; raise ray.train.TrainingFailedError if it fails."""
    os.makedirs(run_root, exist_ok=True)
    # Ray Train's own preemption watcher (an actor polling Ray for draining nodes every 5 s)
    # duplicates what the job manager does with the clouds' notices and lost nodes, and costs
    # about 1% of a 2-core node (BENCHMARKS.md, background CPU). Ray Train passes this
    # variable from the process that calls fit() to its controller. An operator's value wins.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # Ray Train's controller polls its workers every 2 s by default, and each change of its
    # state (started, finished, a worker lost) waits for a poll: every 0.5 s a fit ends (and
    # notices a lost worker) sooner, 18.3 -> 15.8 s for a fit that trains 0.2 s here
    # (benchmarks/fit_poll.py), for a poll that costs one small call per worker.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    groups = run_groups(spec, layout, worker_resources)
    if groups > 1:
        run_elastic_job(spec, layout, groups, job_id, checkpoint_root, run_root, manager,
                        worker_resources, interruption_endpoint)
        return
    build_trainer(spec, layout, job_id, checkpoint_root, run_root, manager, worker_resources,
                  interruption_endpoint).fit()
