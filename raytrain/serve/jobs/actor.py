"""The job manager as the service's one detached Ray actor on the head node: created by the
first HTTP replica that needs it, found by name by everything else, and started again by
Ray if its process is lost (the new one reloads the store; serve/jobs/manager.py).

    manager = get_or_create_manager(config)   # an ActorHandle
"""

from __future__ import annotations

from typing import Any

import ray
from ray.actor import ActorHandle

from raytrain.serve.adaptors.ray_cluster import HEAD_NODE_RESOURCE, MANAGER_NAME, NAMESPACE
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import ServiceConfig


class StartedJobManager(JobManager):
    """The job manager as Ray runs it: started as it is constructed, so that Ray starting it
    again after a loss reloads the store and resumes scheduling."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.start()


JobManagerActor = ray.remote(StartedJobManager)


def get_or_create_manager(config: ServiceConfig) -> ActorHandle:
    """The service's job manager: the running one, or a new one on the head node."""
    return JobManagerActor.options(
        name=MANAGER_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        # Ray restarts a lost manager (its process killed, its node's worker crashed): the new
        # one reloads the store, reclaims what the old one's runs held, and resumes their jobs.
        max_restarts=-1,
        num_cpus=0,
        max_concurrency=64,
        resources={HEAD_NODE_RESOURCE: 0.001},
    ).remote(config.model_dump(mode="json"))


def find_manager() -> ActorHandle | None:
    try:
        return ray.get_actor(MANAGER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
