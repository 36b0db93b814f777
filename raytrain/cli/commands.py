"""`raytrain ...`: a thin command line over the client and the service's deploy helpers.

    raytrain demo                         train examples/demo.yaml on an embedded local Ray
    raytrain serve [--address ADDR]       deploy the service; foreground until SIGINT/SIGTERM
    raytrain submit job.yaml --follow     queue a job and follow it to the end
    raytrain status ID | list | cancel ID [--json]
    raytrain logs ID [--follow]           each worker's output, by rank
    raytrain delete ID                    forget an ended job and delete its checkpoints
    raytrain stop                         stop what `raytrain serve --detach` started
    raytrain plan job.yaml --gpus 16 --gpu rtx4090   rank parallel layouts (offline)
    raytrain offers [job.yaml] [--refresh]           offers, prices, the policy's ranking
    raytrain simulate [--trace FILE]                 replay spot traces under four strategies

The server URL comes from --server (before or after the command), else RAYTRAIN_SERVER, else
http://127.0.0.1:8000.
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

from raytrain.catalog import (
    DEFAULT_POLICY,
    load_offers,
    load_policies,
    save_offers,
    unknown_policy,
)
from raytrain.cli.flags import existing_file, number, port, whole
from raytrain.cli.progress_view import JobProgressView
from raytrain.cli.views import (
    jobs_table,
    offers_table,
    plans_table,
    ranking_table,
    simulation_table,
    status_table,
    summary_table,
)
from raytrain.client import DEFAULT_URL, Client
from raytrain.core.planner import NothingFits
from raytrain.core.simulate import SimJob, compare
from raytrain.errors import FieldError, RaytrainError, SpecError
from raytrain.offers import offers_response
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
from raytrain.traces import load_trace

out = Console()
err = Console(stderr=True)

DEMO_SPEC = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "spot-traces" / "bamboo" / \
    "p3-trace.csv"


# ---------------------------------------------------------------------------------- helpers


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server or os.environ.get("RAYTRAIN_SERVER") or DEFAULT_URL)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def _follow(client: Client, job_id: str, json_output: bool = False) -> JobStatus:
    """Draw progress until the job ends, then its summary (on stderr when stdout is JSON)."""
    started = time.monotonic()
    with JobProgressView(job_id) as view:
        status = client.job(job_id).wait(on_event=view.update)
    (err if json_output else out).print(summary_table(status, time.monotonic() - started))
    return status


def _follow_or_leave(client: Client, job_id: str, json_output: bool = False) -> JobStatus:
    """`_follow`, and on Ctrl-C say that the job goes on and how to stop it."""
    try:
        return _follow(client, job_id, json_output)
    except KeyboardInterrupt:
        err.print(f"\nstopped following job {job_id}; it goes on in the service. Follow it "
                  f"again with `raytrain status {job_id}` or `raytrain logs {job_id} --follow`, "
                  f"or stop it with `raytrain cancel {job_id}`.", highlight=False)
        raise


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
    status = _follow_or_leave(client, job.id, json_output=args.json)
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
    out.print(plans_table(response))
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
    out.print(simulation_table(
        rows, f"{args.nodes} x {offer.instance_type}, {args.work_hours:g} h of work, deadline "
        f"{args.deadline_hours:g} h, notice {args.notice_s:g} s, {args.starts} start times per "
        "trace", policy.name))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    job = _client(args).get(args.id)
    if args.json:
        _print_json(job.model_dump(mode="json"))
    else:
        out.print(status_table(job))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list(states=args.state)
    if args.json:
        _print_json([job.model_dump(mode="json") for job in jobs])
    else:
        out.print(jobs_table(jobs))
    return 0


def _print_job(args: argparse.Namespace, job: JobStatus, line: str) -> int:
    """A job's status as JSON with --json, else one line about it."""
    if args.json:
        _print_json(job.model_dump(mode="json"))
    else:
        out.print(line)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _client(args).cancel(args.id)
    return _print_job(args, job, f"job {job.id} {job.state.value}")


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


def _watch_until_signal(client: Client, interval_s: float = 2.0) -> None:
    """Until SIGINT or SIGTERM, print a line whenever a job appears or changes state."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    seen: dict[str, tuple[str, str | None]] = {}
    first = True
    while not stop.is_set():
        try:
            jobs = client.list()
        except RaytrainError:
            jobs = []
        for job in jobs:
            now = (job.state.value, job.message)
            if seen.get(job.id) != now and not (first and job.state.is_terminal):
                detail = job.error if job.state == JobState.FAILED else job.message
                err.print(f"{time.strftime('%H:%M:%S')} job {job.id} ({job.spec.name}) "
                          f"{job.state.value}" + (f": {escape(detail)}" if detail else ""),
                          highlight=False, soft_wrap=True)
            seen[job.id] = now
        first = False
        stop.wait(interval_s)


def cmd_serve(args: argparse.Namespace) -> int:
    from raytrain.serve.deploy import (
        DetachedService,
        connect_ray,
        deploy,
        detached_service_running,
        lower_detached_daemons,
        start_detached_head,
        undeploy,
    )

    config = _service_config(args)
    if args.detach:
        running = detached_service_running(config.state_path)
        if running is not None:
            raise RaytrainError(
                f"a detached service from {config.state_path} already runs at {running.url}. "
                "To fix: stop it first with `raytrain stop`, or use another --state-dir")
    _require_free_port(args.host, args.port)
    import ray

    head_pid = temp_dir = None
    address = args.address
    if args.detach and not address:
        err.print("starting a local Ray cluster that outlives this command ...")
        address, head_pid, temp_dir = start_detached_head(
            None, config.state_path / "ray-head.log")
    # Ray's actors and workers do not stream into this terminal: jobs' output is in their
    # logs (raytrain logs ID) and the operator sees one line per job state change instead.
    started_ray = connect_ray(address, quiet=True)
    if head_pid is not None:
        lower_detached_daemons(head_pid)
    try:
        url = deploy(config, args.host, args.port)
        err.print(f"raytrain is serving at [bold]{url}[/bold] (OpenAPI at {url}/docs)")
        if args.detach:
            record = DetachedService(url, address or ray.get_runtime_context().gcs_address,
                                     head_pid, temp_dir, time.time())
            record.save(config.state_path)
            err.print(f"detached; stop it with `raytrain stop"
                      f"{'' if args.state_dir is None else ' --state-dir ' + args.state_dir}`",
                      highlight=False)
            return 0
        err.print("press Ctrl-C to stop; each job's state changes are shown here, its workers' "
                  "output with `raytrain logs ID`", highlight=False)
        _watch_until_signal(Client(url))
        err.print("stopping the service")
        undeploy(stop_jobs=started_ray)
    except BaseException:
        if head_pid is not None:  # nothing starts half-way: take the cluster down again
            from raytrain.serve.deploy import stop_detached

            DetachedService("", address, head_pid, temp_dir, time.time()).save(
                config.state_path)
            stop_detached(config.state_path)
        raise
    finally:
        if started_ray and not args.detach:
            ray.shutdown()
        elif args.detach and ray.is_initialized():
            ray.shutdown()  # disconnect; the cluster and the service stay
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from raytrain.serve.deploy import stop_detached

    state_dir = Path(args.state_dir).expanduser()
    with err.status("stopping the detached service"):
        what = stop_detached(state_dir)
    err.print(f"stopped {what}", highlight=False)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    job = _client(args).delete(args.id)
    return _print_job(args, job, f"job {job.id} deleted with its checkpoints and logs")


def cmd_logs(args: argparse.Namespace) -> int:
    """Print each rank's output, prefixed with its rank; with --follow, until the job ends."""
    client = _client(args)
    offsets: dict[int, int] | None = None
    while True:
        answer = client.logs(args.id, offsets, args.rank)
        for chunk in answer.ranks:
            if chunk.skipped:
                sys.stdout.write(f"[rank {chunk.rank}] ... {chunk.skipped:,} bytes left out "
                                 "...\n")
            for line in chunk.text.splitlines():
                sys.stdout.write(f"[rank {chunk.rank}] {line}\n")
        sys.stdout.flush()
        offsets = {chunk.rank: chunk.offset for chunk in answer.ranks}
        if not args.follow or JobState(answer.state).is_terminal:
            if not answer.ranks:
                err.print(f"job {args.id} has no worker output yet ({answer.state})")
            return 0
        time.sleep(1.0)


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
    # Global flags are accepted after the command too: each subcommand knows them, and
    # SUPPRESS keeps a subcommand that was not given one from overwriting the global value.
    global_flags = argparse.ArgumentParser(add_help=False)
    global_flags.add_argument("--server", default=argparse.SUPPRESS,
                              help=f"service URL (default: $RAYTRAIN_SERVER or {DEFAULT_URL})")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, json_flag: bool = False) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help_text, parents=[global_flags])
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    def with_service(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", help="job store and checkpoints (default ~/.raytrain)")
        p.add_argument("--config", metavar="YAML", help="a service config file (ServiceConfig); "
                       "flags given override it")
        p.add_argument("--allow-import", action="append", metavar="PACKAGE",
                       help="allow jobs to import factories from PACKAGE (repeatable)")

    demo = command("demo", "train the demo job on an embedded local Ray")
    demo.add_argument("--spec", default=str(DEMO_SPEC),
                      help="job spec (default: examples/demo.yaml)")
    demo.add_argument("--port", type=port, default=8000)
    with_service(demo)
    demo.set_defaults(func=cmd_demo)

    serve = command("serve", "deploy the service on a Ray cluster")
    serve.add_argument("--address", help="Ray cluster address (default: start a local one)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port, default=8000)
    serve.add_argument("--detach", action="store_true", help="leave it running and return; "
                       "`raytrain stop` stops it")
    serve.add_argument("--cluster-config", metavar="YAML", type=existing_file,
                       help="the cluster's launcher YAML: the service buys its worker node "
                       "types through Ray's autoscaler (default: a fixed cluster)")
    serve.add_argument("--storage-path", help="checkpoints, on storage every node reaches "
                       "(default: <state-dir>/jobs)")
    serve.add_argument("--offers-file", type=existing_file,
                       help="offer catalog to use instead of the cached one")
    serve.add_argument("--policy-dir", help="folder of named policies (default: policies/)")
    serve.add_argument("--default-policy", help="policy of jobs that name none (cost-first)")
    with_service(serve)
    serve.set_defaults(func=cmd_serve)

    stop = command("stop", "stop what `raytrain serve --detach` started, and nothing else")
    stop.add_argument("--state-dir", default="~/.raytrain",
                      help="the state directory the service was started with")
    stop.set_defaults(func=cmd_stop)

    submit = command("submit", "queue a job from a YAML/JSON file", json_flag=True)
    submit.add_argument("file")
    submit.add_argument("--follow", action="store_true", help="show progress until the job ends")
    submit.set_defaults(func=cmd_submit)

    planning = command("plan", "rank the parallel layouts of a job spec on some hardware "
                       "(offline)", json_flag=True)
    planning.add_argument("file")
    planning.add_argument("--gpus", type=whole(at_least=1, at_most=1_000_000),
                          help="devices (default: resources.num_workers)")
    planning.add_argument("--gpu", help="device kind, e.g. h100-sxm, rtx4090 (default: "
                          "resources.accelerator, or cpu)")
    planning.add_argument("--price", type=number(at_least=0),
                          help="USD per device-hour, for $/M tokens")
    planning.add_argument("--top", type=whole(at_least=1), default=10,
                          help="plans to show (default 10)")
    planning.set_defaults(func=cmd_plan)

    offering = command("offers", "instance offers and prices; with a job file, the policy's "
                       "ranking", json_flag=True)
    offering.add_argument("file", nargs="?", help="a job spec to rank the offers for")
    offering.add_argument("--policy", help="policy name (default: the job's, else cost-first)")
    offering.add_argument("--refresh", action="store_true",
                          help="refresh AWS prices and facts through boto3 first")
    offering.add_argument("--region", default="us-east-1", help="AWS region to refresh")
    offering.add_argument("--endpoint-url", help="EC2 endpoint (default: AWS's)")
    offering.add_argument("--state-dir", default="~/.raytrain", help="where the cache lives")
    offering.add_argument("--top", type=whole(at_least=1), default=10,
                          help="options to show (default 10)")
    offering.set_defaults(func=cmd_offers)

    simulating = command("simulate", "replay spot preemption traces: on-demand, spot, "
                         "failover, policy", json_flag=True)
    simulating.add_argument("--trace", action="append", type=existing_file,
                            help="trace file (repeatable; default "
                            "data/spot-traces/bamboo/p3-trace.csv)")
    simulating.add_argument("--instance", default="p3.2xlarge", help="offer's instance type")
    simulating.add_argument("--nodes", type=whole(at_least=1, at_most=10_000), default=8)
    simulating.add_argument("--work-hours", type=number(above=0, at_most=24 * 365), default=6.0,
                            help="hours of training on those nodes without interruption")
    simulating.add_argument("--deadline-hours", type=number(above=0, at_most=24 * 365),
                            default=12.0)
    simulating.add_argument("--policy", default=None, help="policy name (default cost-first)")
    simulating.add_argument("--notice-s", type=number(at_least=0, at_most=3600), default=0.0,
                            help="preemption notice the job can checkpoint in (AWS: 120)")
    simulating.add_argument("--interval-s", type=number(above=0), default=1800.0,
                            help="checkpoint interval of the spot and failover strategies")
    simulating.add_argument("--checkpoint-s", type=number(at_least=0), default=60.0)
    simulating.add_argument("--restart-s", type=number(at_least=0), default=300.0)
    simulating.add_argument("--starts", type=whole(at_least=1, at_most=1000), default=11,
                            help="start times per trace")
    simulating.add_argument("--state-dir", default="~/.raytrain", help="offer cache")
    simulating.set_defaults(func=cmd_simulate)

    status = command("status", "one job's status", json_flag=True)
    status.add_argument("id")
    status.set_defaults(func=cmd_status)

    listing = command("list", "all jobs, oldest first", json_flag=True)
    listing.add_argument("--state", action="append", type=str.upper,
                         choices=[state.value for state in JobState],
                         help="only jobs in this state (repeatable)")
    listing.set_defaults(func=cmd_list)

    cancel = command("cancel", "cancel a job", json_flag=True)
    cancel.add_argument("id")
    cancel.set_defaults(func=cmd_cancel)

    delete = command("delete", "forget an ended job and delete its checkpoints and logs",
                     json_flag=True)
    delete.add_argument("id")
    delete.set_defaults(func=cmd_delete)

    logs = command("logs", "each worker's output of a job, by rank")
    logs.add_argument("id")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new output "
                      "until the job ends")
    logs.add_argument("--rank", type=whole(at_least=0), help="only this rank")
    logs.set_defaults(func=cmd_logs)
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
