"""`raytrain plan`, `raytrain offers` and `raytrain simulate`: the commands that need no
service. They plan, price and replay in this process, from the job file, the catalog and the
traces (the service's own offers and history where a state directory has them).

    raytrain plan job.yaml --gpus 16 --gpu rtx4090   rank parallel layouts (offline)
    raytrain plan job.yaml --shape p5 --layout dp_shard=8,tp=8   that one layout, there
    raytrain offers [job.yaml] [--refresh]           offers, prices, the policy's ranking
    raytrain simulate [--trace FILE]                 replay spot traces under six strategies
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from raytrain.api_tokens import default_state_dir
from raytrain.catalog.hardware import CATALOG
from raytrain.catalog.traces import load_trace, trace_names
from raytrain.cli.commands import err, out, print_json
from raytrain.cli.views import (
    offers_table,
    plans_json,
    plans_table,
    ranking_table,
    seen_table,
    simulation_table,
)
from raytrain.core.autoscale import Observed
from raytrain.core.offers_answer import offers_response
from raytrain.core.planner import NothingFits
from raytrain.core.resolve import rank_plans
from raytrain.core.simulate import as_runs
from raytrain.errors import FieldError, SpecError
from raytrain.spec import (
    JobSpec,
    PlanRequest,
    PolicySpec,
    load_job_spec,
    spec_error_from_validation,
)
from raytrain.spec.files import (
    DEFAULT_POLICY,
    TRACES_DIR,
    load_cpu_profile,
    load_offers,
    load_policies,
    save_offers,
    snapshot,
    unknown_policy,
)
from raytrain.spec.hf_config import gpt_config_from_hf
from raytrain.spec.job import read_document

DEFAULT_TRACE = TRACES_DIR / "bamboo" / "p3-trace.csv"

LAYOUT_KEYS = {"dp_replicate": "dp_replicate", "dp_shard": "dp_shard", "tp": "tp", "pp": "pp",
               "vp": "virtual_stages", "virtual_stages": "virtual_stages",
               "mb": "micro_batch_size", "micro_batch_size": "micro_batch_size",
               "recompute": "recompute", "rs_once": "reduce_scatter_once",
               "reduce_scatter_once": "reduce_scatter_once", "zero2": "zero2"}


def parse_layout(text: str) -> dict[str, Any]:
    """`dp_replicate=2,tp=8,pp=2,vp=2,mb=1,recompute=full` as a LayoutChoice document."""
    choice: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key.strip() not in LAYOUT_KEYS or not value.strip():
            raise SpecError([FieldError(("layout",), (
                f"cannot read {part!r}. To fix: write key=value pairs separated by commas, "
                f"keys from {', '.join(LAYOUT_KEYS)}"))], source="--layout")
        value = value.strip()
        choice[LAYOUT_KEYS[key.strip()]] = int(value) if value.isdigit() else value
    return choice


def cmd_plan(args: argparse.Namespace) -> int:
    """Rank layouts locally (no server needed): the planner is pure arithmetic. With
    --layout, evaluate that one layout; --shape / --shape-file set the node it runs on."""
    state_dir = default_state_dir(args.state_dir)
    hardware = load_cpu_profile(state_dir)  # this machine's, if `raytrain calibrate` ran
    node_shape = None
    if args.shape_file:
        node_shape = read_document(Path(args.shape_file), "--shape-file")
    try:
        request = PlanRequest(
            spec=_plan_spec(args), gpus=args.gpus, accelerator=args.gpu,
            usd_per_gpu_hour=args.price, keep=args.top, precision=args.precision,
            layout=parse_layout(args.layout) if args.layout else None, shape=args.shape,
            node_shape=node_shape)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, "plan request", PlanRequest) from None
    try:
        response = rank_plans(request, snapshot().offers, hardware)
    except NothingFits as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    if args.json:
        print_json(plans_json(response))
        return 0
    out.print(plans_table(response))
    best = response.plans[0]
    if best.tight:
        err.print(f"[yellow]warning:[/yellow] {best.layout} fits only tightly: it needs "
                  f"{best.memory_gib:.1f} GiB per device, over the {best.memory_limit_gib:.1f} "
                  "usable (the rest is the allocator's room) but within the device. It may "
                  "run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; to make room, "
                  "use more pipeline or tensor parallelism, a smaller micro-batch or more "
                  "recomputation")
    elif not best.fits:
        err.print(f"[yellow]warning:[/yellow] {best.layout} does not fit: it needs "
                  f"{best.memory_gib:.1f} GiB per device of {best.memory_limit_gib:.1f} usable")
    out.print(f"{'best' if args.layout is None else 'plan'}: {best.reason}")
    if response.active_params < response.params:
        out.print(f"a mixture of experts: {response.params / 1e9:.2f}B parameters (memory), "
                  f"{response.active_params / 1e9:.2f}B active a token (compute)")
    if args.gpu == "cpu":  # whose figures the CPU predictions are
        calibration = hardware.gpus["cpu"].calibration
        err.print(f"CPU profile: {calibration}" if hardware is not CATALOG else
                  f"CPU profile: the catalog's generic figures (no calibration in {state_dir}); "
                  "`raytrain calibrate` measures this machine's, for predictions that hold "
                  "here", highlight=False, soft_wrap=True)
    return 0


def _plan_spec(args: argparse.Namespace) -> JobSpec:
    """The job `plan` ranks: the spec file's, with --model-config's model in place of its
    own; without a file, that model at --seq-len and --global-batch in bf16."""
    if args.model_config is None:
        if args.file is None:
            raise SpecError([FieldError(("file",), "nothing to plan. To fix: give a job spec "
                                        "file, or --model-config config.json")], "plan")
        if args.seq_len is not None or args.global_batch is not None:
            raise SpecError([FieldError(("seq_len",), "--seq-len and --global-batch shape a "
                                        "--model-config without a spec. To fix: set "
                                        "data.seq_len and training.global_batch_size in the "
                                        "spec")], "plan")
        try:
            return load_job_spec(args.file)
        except SpecError as exc:
            if any(e.path == "model.hf.path" for e in exc.errors):  # a folder not here
                raise SpecError([*exc.errors, FieldError(("model", "hf", "path"), (
                    "to plan it on this machine, give the folder's config.json: raytrain "
                    f"plan {args.file} --model-config CONFIG.json"))], exc.source) from None
            raise
    path = Path(args.model_config)
    gpt = gpt_config_from_hf(read_document(path, "--model-config"), str(path))
    if args.file is not None:
        # The file's document, not its parsed spec: its model section (a folder, perhaps in
        # a bucket this machine does not read) is replaced by --model-config's model.
        document = read_document(Path(args.file), "job spec")
        if not isinstance(document, dict):
            return load_job_spec(args.file)  # its own errors
    else:
        seq_len = args.seq_len or min(4096, gpt.max_seq_len)
        document = {"data": {"seq_len": seq_len},
                    "training": {"global_batch_size": args.global_batch or 512,
                                 "micro_batch_size": 1, "precision": "bf16"},
                    # the layout is the planner's to choose (or --layout's), not data parallel's
                    "parallel": {"strategy": "auto"},
                    "resources": {"num_workers": args.gpus or 8}}
    document["model"] = {"kind": "gpt", "gpt": gpt.model_dump(mode="json")}
    try:
        return JobSpec.model_validate(document)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, str(path), JobSpec) from None


def _refresh_runpod(catalog: Any) -> Any:
    """The catalog with RunPod's prices from its API when a key is set; else a warning."""
    from raytrain.cloud import runpod
    from raytrain.cloud.runpod_offers import refresh

    try:
        api = runpod.RunPodAPI(runpod.api_key(),
                               url=os.environ.get("RUNPOD_API_URL", runpod.API_URL),
                               rest_url=os.environ.get("RUNPOD_REST_URL", runpod.REST_URL))
    except runpod.RunPodError as exc:
        return catalog.model_copy(update={"warnings": [
            *catalog.warnings, f"RunPod prices kept from before: {exc}"]})
    with err.status("refreshing RunPod offers"):
        try:
            return refresh(catalog, api, now=time.time())
        finally:
            api.close()


def cmd_offers(args: argparse.Namespace) -> int:
    """The offer catalog and, for a job, the policy's ranking (offline, like `plan`)."""
    state_dir = default_state_dir(args.state_dir)
    catalog = load_offers(state_dir)
    if args.refresh:
        from raytrain.cloud.aws import Clients, refresh

        with err.status(f"refreshing AWS offers in {args.region}"):
            catalog = refresh(catalog, Clients.create(args.region, args.endpoint_url),
                              args.region, now=time.time())
        catalog = _refresh_runpod(catalog)
        if not catalog.warnings or any(o.note.startswith("refreshed") for o in catalog.offers):
            err.print(f"saved {save_offers(catalog, state_dir)}")
    for warning in catalog.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    spec = load_job_spec(args.file) if args.file else None
    policy = _policy(args.policy or (spec.capacity.policy if spec else None))
    response = offers_response(catalog, policy, spec, keep=args.top,
                               observed=_seen_by_the_service(state_dir))
    if args.json:
        print_json(response.model_dump(mode="json"))
        return 0
    seen = seen_table(response)
    if seen is not None:
        out.print(seen)
    if spec is None:
        out.print(offers_table(response, catalog))
        return 0
    if not response.ranking:
        out.print(offers_table(response, catalog))
        err.print(f"[yellow]no option for {escape(spec.name)}:[/yellow] "
                  f"{escape(response.decision or '')}", highlight=False)
        return 0
    out.print(ranking_table(response, f"{spec.name}: by expected cost to finish (policy "
                                      f"{response.policy}, catalog {catalog.version})"))
    out.print(f"decision: {escape(response.decision or '')}", highlight=False)
    return 0


def _seen_by_the_service(state_dir: Path) -> Observed:
    """The spot preemptions and node-hours a service with this state directory has counted
    (its store, read-only; nothing when no service ran here)."""
    from raytrain.core.tally import Tally
    from raytrain.serve.jobs.store import STORE_FILE, read_tally

    return Observed(spot_history=Tally.from_json(read_tally(state_dir / STORE_FILE)).spot)


def _policy(name: str | None) -> PolicySpec:
    policies = load_policies()
    chosen = name or DEFAULT_POLICY
    error = unknown_policy(chosen, policies)
    if error is not None:
        raise SpecError([error])
    return policies[chosen]


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay spot-fleet traces against one job under each way of buying capacity; the policy
    and the baselines that are policies go through the live service (raytrain.sim.replay)."""
    from raytrain.sim.simulation import TraceJob, simulate_jobs
    from raytrain.sim.workers import CloudTimes

    catalog = load_offers(default_state_dir(args.state_dir))
    offer = next((o for o in catalog.offers if o.instance_type == args.instance), None)
    if offer is None or offer.spot_usd_per_hour is None or offer.on_demand_usd_per_hour is None:
        raise SpecError([FieldError(("instance",), f"{args.instance!r} has no spot and "
                                    "on-demand prices in the catalog. To fix: use one of " + ", "
                                    .join(o.instance_type for o in catalog.offers
                                          if o.spot_usd_per_hour and o.on_demand_usd_per_hour))],
                        "simulation")
    policy = _policy(args.policy)
    notices: list[tuple[float, float] | None] = []
    for seconds in dict.fromkeys(args.notice_s or [None]):
        notices.append(None if seconds is None else
                       (seconds, 1.0 if args.notice_share is None else args.notice_share))
    times = CloudTimes(ready_s=args.ready_s, restart_s=args.restart_s,
                       checkpoint_s=args.checkpoint_s)
    paths = [Path(p) for p in args.trace or [DEFAULT_TRACE]]
    traces = [load_trace(path, name) for path, name in zip(paths, trace_names(paths))]
    for path, trace in zip(paths, traces):
        mismatch = priced_as_another_kind(path.name, offer, catalog.offers)
        if mismatch:
            err.print(f"[yellow]warning:[/yellow] {mismatch}", highlight=False,
                      soft_wrap=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1  # the CPUs this process may use (Linux), else the machine's
    processes = args.processes or max(1, min(cpus, args.starts))
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("start times"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        for trace in traces:
            jobs = [TraceJob(trace, offer, args.nodes, args.work_hours * 3600,
                             args.deadline_hours * 3600 if args.deadline_hours else None,
                             notice, times, args.interval_s) for notice in notices]
            said = ", ".join(f"{job.notice_s:g} s" for job in jobs)
            task = bar.add_task(f"replaying {trace.name} through the service (notice {said}, "
                                f"{processes} process{'es' if processes > 1 else ''})",
                                total=args.starts)
            rows.extend(simulate_jobs(jobs, policy, args.starts, processes=processes,
                                      done=lambda n, task=task: bar.advance(task, n)))
    if args.json:
        print_json(as_runs(rows))
        return 0
    out.print(simulation_table(
        rows, f"{args.nodes} x {offer.instance_type}, {args.work_hours:g} h of work, deadline "
        f"{args.deadline_hours:g} h, {args.starts} start times per trace", policy.name))
    return 0


# What a trace's file name may say of the capacity it recorded, and the catalog's GPU kinds
# that capacity is.
TRACE_KINDS = {"a100": ("a100",), "v100": ("v100",), "p3": ("v100",), "g4dn": ("t4",),
               "t4": ("t4",), "h100": ("h100",), "p5": ("h100",), "l40s": ("l40s",),
               "g6e": ("l40s",), "4090": ("rtx4090",)}


def priced_as_another_kind(trace_file: str, offer: Any, offers: list[Any]) -> str | None:
    """Why a trace whose name says it recorded other GPUs than `offer`'s is worth a warning:
    its preemptions are replayed at `offer`'s prices (None when the name says nothing, or
    the same kind)."""
    said = [kinds for word, kinds in TRACE_KINDS.items() if word in trace_file.lower()]
    if not said or any(offer.gpu_kind.startswith(k) for kinds in said for k in kinds):
        return None
    kinds = said[0]
    matching = sorted({o.instance_type for o in offers if o.gpu_kind.startswith(kinds)
                       and o.spot_usd_per_hour and o.on_demand_usd_per_hour})
    fix = (f"--instance {matching[0]} for that capacity's prices" if matching else
           "--instance with an offer of that kind (the catalog has none with both prices)")
    return (f"{trace_file} looks like {kinds[0]} capacity, but it is priced as "
            f"{offer.instance_type} ({offer.gpu_kind}, --instance). To fix: {fix}, or keep "
            "it to replay its preemptions at these prices on purpose")
