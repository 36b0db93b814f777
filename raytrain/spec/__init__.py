"""The wire and file schema: what a user writes (JobSpec), what the service answers (JobStatus,
JobEvent) and how an operator configures the service (ServiceConfig).

One pydantic schema validates YAML files, REST bodies and stored records alike. Every model is
strict (`extra="forbid"`), every field is described and has a safe default. Cross-field rules
(batch divisibility, degrees that multiply to the worker count, sequence length within the
model's reach) are checked here too and reported at the path of the field to change.

    spec = load_job_spec("examples/demo.yaml")
    spec = JobSpec.model_validate({"training": {"steps": 200}})

spec/ is data and validation only: it imports nothing from raytrain.core (the planner runs
in raytrain.core.resolve, once per job), and validates names against raytrain.catalog.

By module: `job` (the JobSpec), `sections` (its sections), `layout` (the Layout value and
its one feasibility check), `offers` (capacity for sale, policies,
node-type bindings, decisions), `status` (JobStatus, JobEvent and their parts), `service`
(ServiceConfig), `plans` (POST /v1/plans). Import from `raytrain.spec` itself.
"""

from raytrain.spec.gpt_config import GPTConfig
from raytrain.spec.job import (
    JobSpec,
    check_imports_allowed,
    load_job_spec,
    parse_job_spec,
    spec_error_from_validation,
)
from raytrain.spec.layout import Layout, ModelShape, Problem
from raytrain.spec.model import ModelSpec
from raytrain.spec.offers import (
    DecisionRecord,
    ExportAnswer,
    ExportRequest,
    NodeTypeBinding,
    ObservedRate,
    Offer,
    OfferCatalog,
    OfferRow,
    OffersRequest,
    OffersResponse,
    PolicySpec,
    ResumeRequest,
)
from raytrain.spec.plans import (
    LayoutChoice,
    PlanRequest,
    PlanResponse,
    PlanRow,
    ShapeSpec,
)
from raytrain.spec.resources import CapacitySpec, Market, ResourcesSpec
from raytrain.spec.sections import DataSpec, ParallelSpec, TrainingSpec
from raytrain.spec.service import (
    ServiceConfig,
)
from raytrain.spec.status import (
    CheckpointInfo,
    CostFigure,
    GroupStatus,
    JobCosts,
    JobEvent,
    JobHistory,
    JobLogs,
    JobResult,
    JobState,
    JobStatus,
    PlanSummary,
    PreemptionRecord,
    Progress,
    ProgressPoint,
    RankLog,
    Resources,
    StepRecord,
)

__all__ = [
    "GPTConfig",
    "ModelSpec",
    "DataSpec",
    "TrainingSpec",
    "ParallelSpec",
    "ResourcesSpec",
    "Market",
    "CapacitySpec",
    "JobSpec",
    "check_imports_allowed",
    "spec_error_from_validation",
    "parse_job_spec",
    "load_job_spec",
    "Offer",
    "OfferCatalog",
    "PolicySpec",
    "OffersRequest",
    "ResumeRequest",
    "ExportRequest",
    "ExportAnswer",
    "OfferRow",
    "ObservedRate",
    "OffersResponse",
    "NodeTypeBinding",
    "DecisionRecord",
    "JobState",
    "Progress",
    "Resources",
    "RankLog",
    "JobHistory",
    "StepRecord",
    "JobLogs",
    "PlanSummary",
    "CheckpointInfo",
    "CostFigure",
    "GroupStatus",
    "JobCosts",
    "PreemptionRecord",
    "ProgressPoint",
    "JobResult",
    "JobStatus",
    "JobEvent",
    "ServiceConfig",
    "PlanRequest",
    "LayoutChoice",
    "ShapeSpec",
    "PlanRow",
    "PlanResponse",
    "Layout", "ModelShape", "Problem",
]
