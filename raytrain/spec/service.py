"""How an operator configures the service."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from raytrain.spec._base import Strict
from raytrain.spec.offers import NodeTypeBinding, PodType
from raytrain.spec.tracking import TrackingSpec


class ServiceConfig(Strict):
    """How an operator runs the service (`raytrain serve` flags or a YAML file)."""

    tracking: TrackingSpec | None = Field(None, description=(
        "The trackers of a job whose spec names none (tracking: in the job spec)."))
    tracking_credentials_file: str | None = Field(None, max_length=1024, description=(
        "A file of KEY=VALUE lines (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, "
        "MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD) the trackers' credentials are read "
        "from, over the service's environment. Never part of a job, a status or a log."))
    tracking_interval_s: float = Field(
        2.0, gt=0, le=600, description="How often new metrics are sent to the trackers.")
    state_dir: str = Field(
        "~/.raytrain",
        description="Directory on the head node for the job store; checkpoints go under "
        "storage_path. Must survive service restarts.",
    )
    storage_path: str | None = Field(
        None,
        max_length=1024,
        description="Where jobs' checkpoints and logs go, reachable by every worker: a "
        "folder (a shared filesystem on a multi-node cluster), or an S3-compatible bucket "
        "(s3://BUCKET/PREFIX), which also keeps a copy of the job records so that a new head "
        "node recovers every job. Credentials come from the standard AWS chain "
        "(environment, profile, instance role) on every node. Default: <state_dir>/jobs.",
    )
    storage_endpoint: str | None = Field(
        None,
        max_length=512,
        description="Endpoint of an S3-compatible service (R2, B2, MinIO, RunPod), e.g. "
        "https://ACCOUNT.r2.cloudflarestorage.com. Default: AWS_ENDPOINT_URL_S3, else "
        "AWS_ENDPOINT_URL, else AWS's own.",
    )
    storage_lease_s: float = Field(
        30.0, ge=1, le=3600,
        description="With a bucket: how long the service's lease on it lasts unrenewed. A "
        "new head node waits this long for a lost one's lease to lapse; a second service "
        "refuses to start while the lease is renewed.",
    )
    allowed_import_packages: list[str] = Field(
        default_factory=list,
        description="Packages whose factories jobs may import (model.factory, data.factory).",
    )
    scheduler_interval_s: float = Field(
        1.0, gt=0, le=60, description="How often queued jobs are checked against free capacity."
    )
    max_backfill_passes: int = Field(
        5, ge=0, le=1000,
        description="On a fixed cluster, how many times later jobs that fit may start ahead of "
        "the oldest job waiting for capacity; after that nothing passes it (0: strictly first "
        "in, first out).",
    )
    node_types: dict[str, NodeTypeBinding] = Field(
        default_factory=dict,
        description="Ray node types the service may ask the autoscaler for, each with the "
        "offer and market it buys (`raytrain serve --cluster-config` fills it from a cluster "
        "YAML). Empty: a fixed cluster; jobs run on what is there.",
    )
    pod_types: dict[str, PodType] = Field(
        default_factory=dict,
        description="Node types (also in node_types, bound to an offer's spot market) served "
        "by RunPod interruptible pods, which cannot join the Ray cluster: the service rents "
        "one pod a job and runs the job on it over SSH (RUNPOD_API_KEY in the service's "
        "environment). Their jobs' storage must be a bucket or a folder the pods mount.",
    )
    pod_ssh_private_key: str = Field(
        "~/.ssh/raytrain", max_length=1024,
        description="The key the service reaches pod_types' pods with; its .pub beside it "
        "goes to each pod (PUBLIC_KEY).")
    offers_file: str | None = Field(
        None, description="An offer catalog (YAML or JSON) to use instead of the refreshed "
        "cache in state_dir or the shipped snapshot.",
    )
    policy_dir: str | None = Field(
        None, description="Folder of named policies; default: policies/ of the installation."
    )
    default_policy: str = Field(
        "cost-first", description="The policy of jobs that name none."
    )
    review_interval_s: float = Field(
        300.0, gt=0, description="How often the policy looks at a running job again (the "
        "deadline); a change of the offers prompts a look at once.",
    )
    interruption_endpoint: str | None = Field(
        None,
        max_length=256,
        description="Instance metadata service (IMDSv2) every worker of every job watches for "
        "spot interruption notices; '{node}' in it is replaced by the worker's Ray node id "
        "(one service standing in for every node's). Null (the default): only workers on "
        "nodes the service bought on AWS's spot market watch, at AWS's own address; a local "
        "run or a fixed cluster contacts no metadata address.",
    )

    auth: bool = Field(
        True, description="Require a bearer token on every endpoint but /healthz (tokens.json "
        "in state_dir, written at the first start). `raytrain serve --no-auth` turns it off, "
        "on a loopback address only.",
    )
    open_metrics: bool = Field(
        False, description="Serve /metrics without a token (for a Prometheus scraper on a "
        "private network).",
    )
    http_replicas: int = Field(
        1, ge=1, le=16, description="Copies of the HTTP API (Ray Serve replicas on the head node, "
        "sharing the service's port). With 2, a lost one costs clients a retry rather than a "
        "wait for its replacement (BENCHMARKS.md, HTTP replica loss); each takes about "
        "150 MiB on the head node.",
    )
    metrics_retention_s: float = Field(
        24 * 3600.0, ge=0, description="Seconds a job's own series stay in /metrics after it "
        "ends, so its final loss and cost can be scraped.",
    )
    max_active_jobs: int = Field(
        1000, ge=1, le=100_000, description="Jobs queued or running at once; a submit beyond "
        "it answers 429 with Retry-After.",
    )
    max_usd_per_hour: float | None = Field(
        100.0, gt=0, description="Ceiling on the hourly price of all capacity the service "
        "holds or requests at once; a job that would pass it waits, saying so. Null: none.",
    )
    max_usd_per_job: float | None = Field(
        None, gt=0, description="Budget of a job that sets no capacity.budget_usd: on "
        "reaching it the job checkpoints and stops. Null: none.",
    )

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    @field_validator("storage_path")
    @classmethod
    def _storage_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", value)
        if scheme and scheme.group(1) != "s3":
            raise ValueError(f"{scheme.group(1)}:// is not a storage raytrain writes. To fix: "
                             "give a folder every node mounts, or an S3-compatible bucket as "
                             "s3://BUCKET/PREFIX (with --storage-endpoint for R2, B2, MinIO "
                             "or GCS's S3 interoperability)")
        if scheme and not value[len("s3://"):].split("/")[0]:
            raise ValueError("s3:// names no bucket. To fix: write s3://BUCKET or "
                             "s3://BUCKET/PREFIX")
        return value

    @model_validator(mode="after")
    def _pod_types_bound(self) -> ServiceConfig:
        for name in self.pod_types:
            binding = self.node_types.get(name)
            if binding is None or binding.market != "spot":
                raise ValueError(
                    f"pod_types.{name} is not a node type bound to a spot market. To fix: "
                    f"add node_types.{name}: {{offer: runpod/secure/<n>x-<gpu>, market: "
                    "spot, max_nodes: ...}, or remove it from pod_types")
        return self

    @field_validator("storage_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an endpoint URL. To fix: give one like "
                             "https://ACCOUNT.r2.cloudflarestorage.com or http://127.0.0.1:9000")
        return value

    @property
    def storage_uri(self) -> str:
        """Where jobs' checkpoints and logs go: a folder's path, or s3://BUCKET[/PREFIX]."""
        if self.storage_path and self.storage_path.startswith("s3://"):
            return self.storage_path.rstrip("/")
        if self.storage_path:
            return str(Path(self.storage_path).expanduser())
        return str(self.state_path / "jobs")

    def job_uri(self, job_id: str) -> str:
        return f"{self.storage_uri}/{job_id}"

    def checkpoints_uri(self, job_id: str) -> str:
        """Where a job's workers write its checkpoints, and a kind 'hf' job its Hugging Face
        folder at the end (hf/ beside them: raytrain.train.rank)."""
        return f"{self.job_uri(job_id)}/checkpoints"
