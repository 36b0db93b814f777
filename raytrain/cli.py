"""`raytrain ...`: a thin command line over the client and the service's deploy helpers.

    raytrain demo                         train examples/demo.yaml on an embedded local Ray
    raytrain serve [--address ADDR]       deploy the service; foreground until SIGINT/SIGTERM
    raytrain submit job.yaml --follow     queue a job and follow it to the end
    raytrain status ID | list | cancel ID [--json]
    raytrain plan job.yaml --gpus 16 --gpu rtx4090   rank parallel layouts (offline)
    raytrain offers [job.yaml] [--refresh]           offers, prices, the policy's ranking
    raytrain simulate [--trace FILE]                 replay spot traces under four strategies

The server URL comes from --server, else RAYTRAIN_SERVER, else http://127.0.0.1:8000.
Exit codes: 0 success, 1 the job or service failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from raytrain.catalog import (
    DEFAULT_POLICY,
    load_offers,
    load_policies,
    save_offers,
    unknown_policy,
)
from raytrain.client import DEFAULT_URL, Client
from raytrain.core.simulate import SimJob, compare
from raytrain.errors import FieldError, RaytrainError, SpecError
from raytrain.offers import offers_response
from raytrain.traces import load_trace
from raytrain.core.planner import NothingFits
from raytrain.spec import (
    JobState,
    JobStatus,
    PlanRequest,
    PolicySpec,
    ServiceConfig,
    load_job_spec,
    rank_plans,
    spec_error_from_validation,
)

out = Console()
err = Console(stderr=True)

DEMO_SPEC = Path(__file__).resolve().parent.parent / "examples" / "demo.yaml"
DEFAULT_TRACE = Path(__file__).resolve().parent.parent / "data" / "spot-traces" / "bamboo" / \
    "p3-trace.csv"


# ---------------------------------------------------------------------------------- helpers


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server or os.environ.get("RAYTRAIN_SERVER") or DEFAULT_URL)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def _jobs_table(jobs: Sequence[JobStatus]) -> Table:
    table = Table(show_lines=False)
    for column in ("ID", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "WORKERS", "RESTARTS", "AGE"):
        table.add_column(column, no_wrap=column in ("ID", "STATE"))  # IDs get copied
    now = time.time()
    for job in jobs:
        p = job.progress
        table.add_row(
            job.id,
            job.spec.name,
            job.state.value,
            f"{p.step}/{p.total_steps}",
            "-" if p.loss is None else f"{p.loss:.4f}",
            "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}",
            str(job.spec.resources.num_workers),
            str(job.restarts),
            f"{now - job.created_at:.0f}s",
        )
    return table


def _status_table(job: JobStatus) -> Table:
    table = Table(show_header=False, box=None)
    p, r = job.progress, job.resources
    rows = [
        ("id", job.id),
        ("name", job.spec.name),
        ("state", job.state.value + (f" ({job.message})" if job.message else "")),
        ("plan", f"{job.plan.strategy}: {job.plan.description}, {job.plan.backend}, grad accum "
                 f"{job.plan.grad_accum_steps}" if job.plan else "-"),
        ("step", f"{p.step}/{p.total_steps}"),
        ("loss", "-" if p.loss is None else f"{p.loss:.4f} (first {p.first_loss:.4f})"
         if p.first_loss is not None else f"{p.loss:.4f}"),
        ("tokens/s", "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}"),
        ("elapsed / ETA",
         f"{p.elapsed_s:.0f}s / " + ("-" if p.eta_s is None else f"{p.eta_s:.0f}s")),
        ("resources", f"{r.accelerator}, {r.market}, {r.nodes} node(s), {r.cpus:g} CPU, "
                      f"{r.gpus:g} GPU, ${r.hourly_usd:.2f}/h"),
        ("cost", f"${job.cost_usd:.2f}"),
        ("restarts / preemptions", f"{job.restarts} / {job.preemptions}"),
        ("checkpoint",
         f"step {job.checkpoint.step}: {job.checkpoint.path}" if job.checkpoint else "-"),
    ]
    if job.error:
        rows.append(("error", job.error))
    for key, value in rows:
        table.add_row(f"[bold]{key}", value)
    return table


def _summary(job: JobStatus, wall_s: float | None = None) -> Table:
    table = Table(title=f"job {job.id} {job.state.value}", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # paths are copied: fold, never truncate
    result = job.result
    if result is not None:
        table.add_row("loss", f"{result.first_loss:.4f} -> {result.final_loss:.4f}")
        table.add_row("steps", str(result.steps))
        table.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s")
        table.add_row("training time", f"{result.train_wall_s:.1f} s")
    if wall_s is not None:
        table.add_row("wall time", f"{wall_s:.1f} s (submit to end)")
    table.add_row("restarts", str(job.restarts))
    if job.checkpoint:
        table.add_row("checkpoint", job.checkpoint.path)
    if job.error:
        table.add_row("error", job.error)
    return table


def _follow(client: Client, job_id: str, json_output: bool = False) -> JobStatus:
    """Draw progress until the job ends, then its summary (on stderr when stdout is JSON)."""
    started = time.monotonic()
    status = client.job(job_id).wait(progress=True)
    (err if json_output else out).print(_summary(status, time.monotonic() - started))
    return status


# --------------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.submit(load_job_spec(args.file))
    if args.json and not args.follow:
        _print_json(job.status().model_dump(mode="json"))
        return 0
    err.print(f"submitted job [bold]{job.id}[/bold]")
    if not args.follow:
        out.print(job.id)
        return 0
    status = _follow(client, job.id, json_output=args.json)
    if args.json:
        _print_json(status.model_dump(mode="json"))
    return 0 if status.state == JobState.SUCCEEDED else 1


def cmd_plan(args: argparse.Namespace) -> int:
    """Rank layouts locally (no server needed): the planner is pure arithmetic."""
    try:
        request = PlanRequest(spec=load_job_spec(args.file), gpus=args.gpus,
                              accelerator=args.gpu, usd_per_gpu_hour=args.price, keep=args.top)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source="plan request") from None
    try:
        response = rank_plans(request)
    except NothingFits as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    if args.json:
        _print_json(response.model_dump(mode="json"))
        return 0
    table = Table(title=f"{response.gpus} x {response.accelerator} "
                        f"(catalog {response.catalog_version}), fastest first")
    for column in ("#", "layout", "step s", "tokens/s", "MFU", "GiB/device", "scaling",
                   "$/M tokens"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for row in response.plans:
        table.add_row(
            str(row.rank), row.layout, f"{row.step_s:.3f}", f"{row.tokens_per_s:,.0f}",
            f"{row.mfu:.0%}", f"{row.memory_gib:.1f}/{row.memory_limit_gib:.0f}",
            f"{row.scaling_efficiency:.0%}",
            "-" if row.usd_per_million_tokens is None else f"{row.usd_per_million_tokens:.3g}",
        )
    out.print(table)
    out.print(f"best: {response.plans[0].reason}")
    return 0


def cmd_offers(args: argparse.Namespace) -> int:
    """The offer catalog and, for a job, the policy's ranking (offline, like `plan`)."""
    state_dir = Path(args.state_dir).expanduser()
    catalog = load_offers(state_dir)
    if args.refresh:
        from raytrain.cloud.aws import Clients, refresh

        with err.status(f"refreshing AWS offers in {args.region}"):
            catalog = refresh(catalog, Clients.create(args.region, args.endpoint_url),
                              args.region, now=time.time())
        if not catalog.warnings or any(o.note.startswith("refreshed") for o in catalog.offers):
            err.print(f"saved {save_offers(catalog, state_dir)}")
    for warning in catalog.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    policy = spec = None
    if args.file:
        spec = load_job_spec(args.file)
        policy = _policy(args.policy or spec.capacity.policy)
    response = offers_response(catalog, policy, spec, keep=args.top)
    if args.json:
        _print_json(response.model_dump(mode="json"))
        return 0
    if not response.ranking:
        table = Table(title=f"offers (catalog {catalog.version}, {catalog.source})")
        for column in ("provider", "instance", "GPUs", "link", "network", "on-demand $/h",
                       "spot $/h", "interruptions/h"):
            table.add_column(column, justify="left" if column in (
                "provider", "instance", "link") else "right")
        for o in response.offers:
            table.add_row(f"{o.provider} {o.region}", o.instance_type,
                          f"{o.gpus_per_node} x {o.gpu_kind}", o.intra_link,
                          f"{o.network_gbps:g} Gb/s" + (" RDMA" if o.rdma else ""),
                          _usd(o.on_demand_usd_per_hour), _usd(o.spot_usd_per_hour),
                          f"{o.spot_interruptions_per_hour:.2g}")
        out.print(table)
        return 0
    table = Table(title=f"{spec.name if spec else ''}: options by expected cost to finish "
                        f"(policy {response.policy}, catalog {catalog.version})")
    for column in ("#", "nodes x offer", "market", "$/h", "tokens/s", "layout", "hours",
                   "$ to finish", "ckpt every"):
        table.add_column(column, justify="left" if column in ("nodes x offer", "layout",
                                                             "market") else "right")
    for row in response.ranking:
        table.add_row(str(row.rank), f"{row.nodes} x {row.instance_type}", row.market,
                      f"{row.usd_per_hour:,.2f}", f"{row.tokens_per_s:,.0f}", row.layout,
                      f"{row.expected_hours:,.3g}", f"{row.expected_cost_usd:,.3g}",
                      "-" if row.checkpoint_interval_s is None
                      else f"{row.checkpoint_interval_s:,.0f} s")
    out.print(table)
    out.print(f"decision: {escape(response.decision or '')}", highlight=False)
    return 0


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _policy(name: str | None) -> PolicySpec:
    policies = load_policies()
    chosen = name or DEFAULT_POLICY
    error = unknown_policy(chosen, policies)
    if error is not None:
        raise SpecError([error])
    return policies[chosen]


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay spot-fleet traces against one job under each way of buying capacity."""
    catalog = load_offers(Path(args.state_dir).expanduser())
    offer = next((o for o in catalog.offers if o.instance_type == args.instance), None)
    if offer is None or offer.spot_usd_per_hour is None or offer.on_demand_usd_per_hour is None:
        raise SpecError([FieldError(("instance",), f"{args.instance!r} has no spot and "
                                    "on-demand prices in the catalog. To fix: use one of " + ", "
                                    .join(o.instance_type for o in catalog.offers
                                          if o.spot_usd_per_hour and o.on_demand_usd_per_hour))],
                        "simulation")
    job = SimJob(offer=offer, nodes=args.nodes, work_s=args.work_hours * 3600,
                 deadline_s=args.deadline_hours * 3600 if args.deadline_hours else None,
                 checkpoint_cost_s=args.checkpoint_s, restart_s=args.restart_s,
                 fixed_interval_s=args.interval_s, notice_s=args.notice_s)
    policy = _policy(args.policy)
    rows = []
    for path in args.trace or [DEFAULT_TRACE]:
        trace = load_trace(Path(path))
        with err.status(f"replaying {trace.name}"):
            rows.extend(compare(trace, job, policy, starts=args.starts))
    if args.json:
        _print_json([asdict(row) for row in rows])
        return 0
    table = Table(title=f"{args.nodes} x {offer.instance_type}, {args.work_hours:g} h of work, "
                        f"deadline {args.deadline_hours or '-'} h, notice {args.notice_s:g} s, "
                        f"{args.starts} start times per trace")
    for column in ("trace", "strategy", "mean $", "mean hours", "deadline misses",
                   "preemptions", "work lost h", "on-demand h"):
        table.add_column(column, justify="left" if column in ("trace", "strategy") else "right")
    for row in rows:
        table.add_row(row.trace, row.strategy if row.strategy != "policy" else
                      f"policy ({policy.name})", f"{row.mean_cost_usd:,.2f}",
                      f"{row.mean_hours:.2f}", f"{row.deadline_misses}/{row.runs}",
                      f"{row.mean_preemptions:.1f}", f"{row.mean_lost_work_hours:.2f}",
                      f"{row.mean_on_demand_hours:.2f}")
    out.print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    job = _client(args).get(args.id)
    if args.json:
        _print_json(job.model_dump(mode="json"))
    else:
        out.print(_status_table(job))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list()
    if args.json:
        _print_json([job.model_dump(mode="json") for job in jobs])
    else:
        out.print(_jobs_table(jobs))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _client(args).cancel(args.id)
    if args.json:
        _print_json(job.model_dump(mode="json"))
    else:
        out.print(f"job {job.id} {job.state.value}")
    return 0


def _service_config(args: argparse.Namespace) -> ServiceConfig:
    """The service's config: a --config YAML if given, then each flag given on top; with
    --cluster-config, the node types the service may buy, each bound to its offer (checked
    before anything starts)."""
    base: dict[str, Any] = {}
    if getattr(args, "config", None):
        base = _read_yaml(Path(args.config), "service config")
        base = _absolute_paths(base, Path(args.config).expanduser().resolve().parent)
    flags = _absolute_paths({
        "state_dir": args.state_dir,
        "allowed_import_packages": args.allow_import,
        "storage_path": getattr(args, "storage_path", None),
        "offers_file": getattr(args, "offers_file", None),
        "policy_dir": getattr(args, "policy_dir", None),
        "default_policy": getattr(args, "default_policy", None),
    }, Path.cwd())
    try:
        config = ServiceConfig.model_validate(
            {**base, **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as exc:
        raise spec_error_from_validation(exc, source="service config") from None
    cluster_path = getattr(args, "cluster_config", None)
    if cluster_path:
        from raytrain.cloud.cluster import load_cluster_config, node_type_bindings
        from raytrain.serve.provisioning import catalog_for

        bindings = node_type_bindings(load_cluster_config(Path(cluster_path)),
                                      catalog_for(config))
        config = config.model_copy(update={"node_types": bindings})
    return config


def _absolute_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths made absolute against `base`: the service's actors run elsewhere."""
    paths = ("state_dir", "storage_path", "offers_file", "policy_dir")
    return {k: str(base / Path(v).expanduser()) if k in paths and isinstance(v, str)
            and not Path(v).expanduser().is_absolute() else v for k, v in values.items()}


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError([FieldError(("config",), f"cannot read {path}: {exc}. To fix: give "
                                    f"the path of a {what} YAML")], what) from None
    if not isinstance(document, dict):
        raise SpecError([FieldError(("config",), f"{path} is not a YAML mapping")], what)
    return document


def _require_free_port(host: str, port: int) -> None:
    """Fail before anything starts when the service's port is taken."""
    from raytrain.serve.deploy import port_is_free

    if not port_is_free(host, port):
        raise RaytrainError(
            f"port {port} on {host} is already in use. To fix: stop what holds it, "
            "or pass --port"
        )


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        stop.wait(1.0)


def cmd_serve(args: argparse.Namespace) -> int:
    from raytrain.serve.deploy import connect_ray, deploy, undeploy

    _require_free_port(args.host, args.port)
    import ray

    started_ray = connect_ray(args.address)
    try:
        url = deploy(_service_config(args), args.host, args.port)
        err.print(f"raytrain is serving at [bold]{url}[/bold] (OpenAPI at {url}/docs)")
        if args.detach:
            return 0
        err.print("press Ctrl-C to stop")
        _wait_for_signal()
        err.print("stopping the service")
        undeploy(stop_jobs=started_ray)
    finally:
        if started_ray and not args.detach:
            ray.shutdown()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from raytrain.serve.deploy import connect_ray, deploy, undeploy

    spec = load_job_spec(args.spec)
    _require_free_port("127.0.0.1", args.port)
    import ray

    wall_started = time.monotonic()
    err.print("starting a local Ray cluster and the raytrain service ...")
    connect_ray(None, quiet=True)
    try:
        url = deploy(_service_config(args), "127.0.0.1", args.port)
        err.print(f"service up at {url} after {time.monotonic() - wall_started:.1f} s; "
                  f"submitting {args.spec}", soft_wrap=True, highlight=False)
        client = Client(url)
        job = client.submit(spec)
        try:
            status = _follow(client, job.id)
        except BaseException:
            job.cancel()  # the demo owns its job: do not leave it queued for the next start
            raise
        out.print(f"demo wall time: {time.monotonic() - wall_started:.1f} s")
        if status.state != JobState.SUCCEEDED:
            err.print(f"[red]the demo job ended {status.state.value}:[/red] "
                      f"{escape(str(status.error))}")
            return 1
        return 0
    finally:
        undeploy(stop_jobs=True)
        ray.shutdown()


# ------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--server",
                        help=f"service URL (default: $RAYTRAIN_SERVER or {DEFAULT_URL})")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_json(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    def with_service(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", help="job store and checkpoints (default ~/.raytrain)")
        p.add_argument("--config", metavar="YAML", help="a service config file (ServiceConfig); "
                       "flags given override it")
        p.add_argument("--allow-import", action="append", metavar="PACKAGE",
                       help="allow jobs to import factories from PACKAGE (repeatable)")

    demo = commands.add_parser("demo", help="train the demo job on an embedded local Ray")
    demo.add_argument("--spec", default=str(DEMO_SPEC),
                      help="job spec (default: examples/demo.yaml)")
    demo.add_argument("--port", type=int, default=8000)
    with_service(demo)
    demo.set_defaults(func=cmd_demo)

    serve = commands.add_parser("serve", help="deploy the service on a Ray cluster")
    serve.add_argument("--address", help="Ray cluster address (default: start a local one)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--detach", action="store_true", help="leave it running and return")
    serve.add_argument("--cluster-config", metavar="YAML",
                       help="the cluster's launcher YAML: the service buys its worker node "
                       "types through Ray's autoscaler (default: a fixed cluster)")
    serve.add_argument("--storage-path", help="checkpoints, on storage every node reaches "
                       "(default: <state-dir>/jobs)")
    serve.add_argument("--offers-file", help="offer catalog to use instead of the cached one")
    serve.add_argument("--policy-dir", help="folder of named policies (default: policies/)")
    serve.add_argument("--default-policy", help="policy of jobs that name none (cost-first)")
    with_service(serve)
    serve.set_defaults(func=cmd_serve)

    submit = with_json(commands.add_parser("submit", help="queue a job from a YAML/JSON file"))
    submit.add_argument("file")
    submit.add_argument("--follow", action="store_true", help="show progress until the job ends")
    submit.set_defaults(func=cmd_submit)

    planning = with_json(commands.add_parser(
        "plan", help="rank the parallel layouts of a job spec on some hardware (offline)"))
    planning.add_argument("file")
    planning.add_argument("--gpus", type=int, help="devices (default: resources.num_workers)")
    planning.add_argument("--gpu", help="device kind, e.g. h100-sxm, rtx4090 (default: "
                          "resources.accelerator, or cpu)")
    planning.add_argument("--price", type=float, help="USD per device-hour, for $/M tokens")
    planning.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    planning.set_defaults(func=cmd_plan)

    offering = with_json(commands.add_parser(
        "offers", help="instance offers and prices; with a job file, the policy's ranking"))
    offering.add_argument("file", nargs="?", help="a job spec to rank the offers for")
    offering.add_argument("--policy", help="policy name (default: the job's, else cost-first)")
    offering.add_argument("--refresh", action="store_true",
                          help="refresh AWS prices and facts through boto3 first")
    offering.add_argument("--region", default="us-east-1", help="AWS region to refresh")
    offering.add_argument("--endpoint-url", help="EC2 endpoint (default: AWS's)")
    offering.add_argument("--state-dir", default="~/.raytrain", help="where the cache lives")
    offering.add_argument("--top", type=int, default=10, help="options to show (default 10)")
    offering.set_defaults(func=cmd_offers)

    simulating = with_json(commands.add_parser(
        "simulate", help="replay spot preemption traces: on-demand, spot, failover, policy"))
    simulating.add_argument("--trace", action="append", help="trace file (repeatable; default "
                            "data/spot-traces/bamboo/p3-trace.csv)")
    simulating.add_argument("--instance", default="p3.2xlarge", help="offer's instance type")
    simulating.add_argument("--nodes", type=int, default=8)
    simulating.add_argument("--work-hours", type=float, default=6.0,
                            help="hours of training on those nodes without interruption")
    simulating.add_argument("--deadline-hours", type=float, default=12.0)
    simulating.add_argument("--policy", default=None, help="policy name (default cost-first)")
    simulating.add_argument("--notice-s", type=float, default=0.0,
                            help="preemption notice the job can checkpoint in (AWS: 120)")
    simulating.add_argument("--interval-s", type=float, default=1800.0,
                            help="checkpoint interval of the spot and failover strategies")
    simulating.add_argument("--checkpoint-s", type=float, default=60.0)
    simulating.add_argument("--restart-s", type=float, default=300.0)
    simulating.add_argument("--starts", type=int, default=11, help="start times per trace")
    simulating.add_argument("--state-dir", default="~/.raytrain", help="offer cache")
    simulating.set_defaults(func=cmd_simulate)

    status = with_json(commands.add_parser("status", help="one job's status"))
    status.add_argument("id")
    status.set_defaults(func=cmd_status)

    listing = with_json(commands.add_parser("list", help="all jobs"))
    listing.set_defaults(func=cmd_list)

    cancel = with_json(commands.add_parser("cancel", help="cancel a job"))
    cancel.add_argument("id")
    cancel.set_defaults(func=cmd_cancel)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except RaytrainError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
