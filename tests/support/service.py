"""The HTTP API in one process, for tests: a real job manager on the recording fake cluster
(raytrain/testing/fake_ray.py) behind `build_app`, driven through httpx's ASGITransport, with a
small job and rank 0's reports as the workers send them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable

import httpx

from raytrain.core.resolve import plan_summary
from raytrain.serve.http.app import InProcess, build_app
from raytrain.serve.http.auth import AuthPace, operator_token
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import PlanSummary, ServiceConfig
from raytrain.testing.fake_ray import FakeRay


def small_job(**resources: Any) -> dict[str, Any]:
    return {"name": "tiny",
            "model": {"gpt": {"vocab_size": 128, "dim": 64, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 32}},
            "data": {"seq_len": 32},
            "training": {"steps": 60, "global_batch_size": 64, "micro_batch_size": 4},
            "resources": {"num_workers": 2, "cpus_per_worker": 1, **resources}}


class Service:
    """A manager on the fake cluster and a synchronous client of its app."""

    def __init__(self, state_dir: Path, cluster: FakeRay | None = None,
                 planner: Callable[..., PlanSummary] = plan_summary,
                 auth_pace: AuthPace = AuthPace(), **config: Any) -> None:
        self.cluster = cluster or FakeRay(cpus=4)
        self.config = ServiceConfig(state_dir=str(state_dir), **config)
        self.manager = JobManager(self.config.model_dump(mode="json"), cluster=self.cluster,
                                  schedule=False, planner=planner).start()
        self.app = build_app(InProcess(self.manager), self.config.open_metrics,
                             self.config.auth, auth_pace=auth_pace)
        self.token = operator_token(self.config)

    def request(self, method: str, path: str, token: str | None = "operator",
                **kwargs: Any) -> httpx.Response:
        """A request with the operator's token (`token=None`: none; else that token)."""
        if token is not None:
            kwargs["headers"] = {"Authorization": f"Bearer "
                                 f"{self.token if token == 'operator' else token}",
                                 **kwargs.get("headers", {})}

        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
                return await c.request(method, path, **kwargs)
        return asyncio.run(send())

    def tick(self) -> None:
        self.manager.scheduler.pass_once()

    def state(self, job_id: str) -> str:
        return self.request("GET", f"/v1/jobs/{job_id}").json()["state"]

    def events(self, job_id: str, after: int = -1) -> list[dict[str, Any]]:
        """The job's stream through the API (ASGITransport reads a response whole, so the job
        must have ended); `recorded` reads it from the manager while it runs."""
        text = self.request("GET", f"/v1/jobs/{job_id}/events", params={"after": after}).text
        return [json.loads(line[len("data: "):]) for line in text.splitlines()
                if line.startswith("data: ")]

    def recorded(self, job_id: str) -> list[dict[str, Any]]:
        return self.manager.wait_events(job_id, -1, 0.0) or []

    def train(self, job_id: str, steps: int, group: str = "pg-1") -> int:
        """What rank 0 does: start, report each step, checkpoint at the last; the attempt."""
        attempt = self.manager.worker_group_started(
            job_id, 0, {"placement_group": group, "accelerator": "cpu", "nodes": 1})
        for step in range(1, steps + 1):
            self.cluster.advance(1.0)
            reply = self.manager.report_progress(job_id, attempt, progress(step))
            assert reply["stop"] is False and reply["move"] is False
        self.manager.report_checkpoint(job_id, attempt, steps, f"/ckpt/{steps}", 0.5)
        return attempt


def progress(step: int) -> dict[str, Any]:
    return {"step": step, "total_steps": 60, "loss": 5.0 - step / 100, "first_loss": 5.0,
            "tokens_per_s": 1000.0, "elapsed_s": float(step), "eta_s": 60.0 - step,
            "sent_at": 0.0}


def result(steps: int) -> dict[str, Any]:
    return {"first_loss": 5.0, "final_loss": 4.4, "steps": steps, "train_wall_s": 60.0,
            "tokens_per_s": 1000.0}
