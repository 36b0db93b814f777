"""Cluster launcher configs (`cluster.yaml`) as the service reads them: which Ray node type
buys which offer in which market, and the checks Ray's own schema does not make.

Every worker node type carries a custom resource named after itself (amount 1 per node); the
service asks Ray's autoscaler for a node type by that resource and places a job's workers on
it by the same resource. On AWS the market comes from the node type's
`InstanceMarketOptions` (spot) or its absence (on-demand), and the offer from its instance
type and the provider's region. On RunPod (the external provider
raytrain.cloud.runpod_provider) the market comes from `interruptible`, and the offer from
`gpu_type_id` and `gpu_count` (runpod/secure/<count>x-<gpu kind>).

    problems = check_cluster_config(document, catalog)         # [] when good
    bindings = node_type_bindings(document, catalog)            # {"p5-spot": NodeTypeBinding}
    validate_with_ray(document)                                 # Ray's schema, offline
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raytrain.errors import FieldError, SpecError
from raytrain.spec import NodeTypeBinding, OfferCatalog
from raytrain.spec.offers import PodType


def load_cluster_config(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError([FieldError(("cluster_config",), f"cannot read {path}: {exc}. To fix: "
                                    "give the path of the cluster YAML")], "service config")
    if not isinstance(document, dict):
        raise SpecError([FieldError(("cluster_config",), f"{path} is not a YAML mapping")],
                        "service config")
    return document


def _worker_types(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    head = document.get("head_node_type")
    return {name: spec for name, spec in (document.get("available_node_types") or {}).items()
            if name != head}


RUNPOD_MODULE = "raytrain.cloud.runpod_provider.RunPodNodeProvider"


def _is_runpod(provider: dict[str, Any]) -> bool:
    return provider.get("type") == "external" and provider.get("module") == RUNPOD_MODULE


def _market(node_config: dict[str, Any]) -> str:
    if "interruptible" in node_config:
        return "spot" if node_config["interruptible"] else "on-demand"
    options = node_config.get("InstanceMarketOptions") or {}
    return "spot" if str(options.get("MarketType", "")).lower() == "spot" else "on-demand"


def _runpod_offer_id(node_config: dict[str, Any]) -> str | None:
    from raytrain.cloud.runpod import GPU_KINDS  # httpx only where RunPod is used

    kind = GPU_KINDS.get(str(node_config.get("gpu_type_id")))
    count = node_config.get("gpu_count")
    return f"runpod/secure/{count}x-{kind}" if kind and isinstance(count, int) else None


def _runpod_problems(here: tuple[str, ...], node_config: dict[str, Any],
                     catalog: OfferCatalog) -> list[FieldError]:
    from raytrain.cloud.runpod import GPU_KINDS

    gpu = node_config.get("gpu_type_id")
    if gpu not in GPU_KINDS:
        return [FieldError(here + ("node_config", "gpu_type_id"), f"{gpu!r} is not a GPU type "
                           "the catalog prices. To fix: use one of "
                           + ", ".join(sorted(GPU_KINDS)))]
    offer = _runpod_offer_id(node_config)
    if offer not in {o.id for o in catalog.offers}:
        sizes = sorted(o.gpus_per_node for o in catalog.offers if o.provider == "runpod"
                       and o.gpu_kind == GPU_KINDS[node_config["gpu_type_id"]])
        return [FieldError(here + ("node_config", "gpu_count"), f"no RunPod offer of "
                           f"{node_config.get('gpu_count')!r} x {node_config['gpu_type_id']}. "
                           f"To fix: use one of {sizes}")]
    if not isinstance(node_config.get("interruptible"), bool):
        return [FieldError(here + ("node_config", "interruptible"), "missing. To fix: false "
                           "(on-demand pods: RunPod's interruptible pods cannot join a Ray "
                           "cluster)")]
    from raytrain.cloud.runpod import node_config_problem

    problem = node_config_problem(node_config)
    if problem:
        key = next((k for k in ("deploy_input", "support_public_ip", "bid_per_gpu")
                    if k in node_config), "interruptible")
        return [FieldError(here + ("node_config", key), problem)]
    return []


def check_cluster_config(document: dict[str, Any], catalog: OfferCatalog) -> list[FieldError]:
    """What Ray's schema lets through: a missing region, min above max, unknown instance types,
    typos in node_config keys we rely on, node types without their own resource."""
    problems: list[FieldError] = []
    provider = document.get("provider") or {}
    if provider.get("type") == "aws" and not provider.get("region"):
        problems.append(FieldError(("provider", "region"), "an AWS cluster needs a region. To "
                                   "fix: set provider.region, e.g. us-east-1"))
    region = provider.get("region")
    known = {o.instance_type for o in catalog.offers if o.provider == "aws"
             and o.region == region}
    total_max = document.get("max_workers")
    if not _worker_types(document):
        problems.append(FieldError(("available_node_types",), "no worker node types: the "
                                   "service has nothing to buy. To fix: add node types besides "
                                   "head_node_type"))
    for name, spec in _worker_types(document).items():
        here = ("available_node_types", name)
        low, high = spec.get("min_workers", 0), spec.get("max_workers", 0)
        if low > high:
            problems.append(FieldError(here + ("min_workers",), f"min_workers={low} exceeds "
                                       f"max_workers={high}. To fix: lower min_workers"))
        if isinstance(total_max, int) and high > total_max:
            problems.append(FieldError(here + ("max_workers",), f"max_workers={high} exceeds the "
                                       f"cluster's max_workers={total_max}"))
        if (spec.get("resources") or {}).get(name) != 1:
            problems.append(FieldError(here + ("resources",), f"the node type needs the custom "
                                       f"resource {name!r}: 1, by which the service requests it "
                                       f"and places jobs on it. To fix: add {{{name}: 1}}"))
        node_config = spec.get("node_config") or {}
        if _is_runpod(provider):
            problems += _runpod_problems(here, node_config, catalog)
        if provider.get("type") != "aws":
            continue
        misspelt = [k for k in node_config if k.lower() == "instancetype" and k != "InstanceType"]
        problems += [FieldError(here + ("node_config", k), "misspelt. To fix: InstanceType")
                     for k in misspelt]
        instance = node_config.get("InstanceType")
        if instance is None and not misspelt:
            problems.append(FieldError(here + ("node_config", "InstanceType"), "missing. To "
                                       "fix: name the EC2 instance type"))
        elif instance is not None and region and instance not in known:
            problems.append(FieldError(here + ("node_config", "InstanceType"), f"{instance!r} "
                                       f"is not an offer in {region}. To fix: use one of "
                                       + ", ".join(sorted(known))))
        options = node_config.get("InstanceMarketOptions")
        if options is not None and str(options.get("MarketType", "")).lower() != "spot":
            problems.append(FieldError(here + ("node_config", "InstanceMarketOptions"),
                                       "MarketType must be 'spot' (leave the block out for "
                                       "on-demand)"))
    return problems


def node_type_bindings(document: dict[str, Any], catalog: OfferCatalog
                       ) -> dict[str, NodeTypeBinding]:
    """The offer and market each worker node type buys; SpecError lists every problem."""
    problems = check_cluster_config(document, catalog)
    if problems:
        raise SpecError(problems, "cluster config")
    region = (document.get("provider") or {}).get("region")
    bindings = {}
    runpod = _is_runpod(document.get("provider") or {})
    for name, spec in _worker_types(document).items():
        node_config = spec.get("node_config") or {}
        offer = _runpod_offer_id(node_config) if runpod else next(
            o.id for o in catalog.offers if o.provider == "aws" and o.region == region
            and o.instance_type == node_config["InstanceType"])
        bindings[name] = NodeTypeBinding(offer=offer, market=_market(node_config),
                                         max_nodes=spec.get("max_workers", 0))
    return bindings


def pod_types(document: dict[str, Any], catalog: OfferCatalog
              ) -> tuple[dict[str, NodeTypeBinding], dict[str, PodType]]:
    """A RunPod cluster's `provider.pod_types`: node types that are no Ray node types but
    RunPod interruptible pods the service rents and drives over SSH, one a job
    (raytrain.cloud.pod_runs); each bound to its offer's spot market. SpecError names each
    bad one."""
    provider = document.get("provider") or {}
    declared = provider.get("pod_types") or {}
    if declared and not _is_runpod(provider):
        raise SpecError([FieldError(("provider", "pod_types"), "pod types are RunPod's "
                                    "interruptible pods. To fix: use them with raytrain's RunPod "
                                    "provider, or remove them")], "cluster config")
    bindings, types, problems = {}, {}, []
    for name, fields in declared.items():
        here = ("provider", "pod_types", name)
        try:
            pod = PodType.model_validate(fields)
        except ValidationError as exc:
            problems += [FieldError(here + tuple(str(p) for p in e["loc"]), e["msg"])
                         for e in exc.errors()]
            continue
        offer = _runpod_offer_id({"gpu_type_id": pod.gpu_type_id, "gpu_count": pod.gpu_count})
        if offer is None or catalog.find(offer) is None:
            problems.append(FieldError(here + ("gpu_type_id",), f"no RunPod offer of "
                                       f"{pod.gpu_count} x {pod.gpu_type_id}. To fix: use a "
                                       "GPU type and count the catalog prices"))
            continue
        if name in _worker_types(document):
            problems.append(FieldError(here, f"{name} is also a Ray node type. To fix: give "
                                       "the pod type a name of its own"))
            continue
        bindings[name] = NodeTypeBinding(offer=offer, market="spot", max_nodes=1)
        types[name] = pod
    if problems:
        raise SpecError(problems, "cluster config")
    return bindings, types


def validate_with_ray(document: dict[str, Any], fill_defaults: bool = True) -> None:
    """Ray's own schema check of a cluster config, offline; raises its error. fill_defaults:
    merge the provider's defaults first, as `ray up` does (the fake multi-node provider's
    defaults file is missing from Ray's wheel: check its configs as written)."""
    # Private: Ray has no public check of a cluster config short of `ray up` itself, which
    # starts a cluster. tests/service/test_ray_private.py fails when Ray changes these.
    from ray.autoscaler._private.util import prepare_config, validate_config

    document = copy.deepcopy(document)
    validate_config(prepare_config(document) if fill_defaults else document)
