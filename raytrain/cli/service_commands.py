"""`raytrain serve`, `raytrain stop` and `raytrain demo`: the commands that start or stop
a service (a Ray cluster with the API deployed on it) rather than talk to one.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from pydantic import ValidationError
from rich.markup import escape

from raytrain.api_tokens import (
    OPERATOR,
    STATE_DIR_ENV,
    default_state_dir,
    is_loopback,
    read_tokens,
    remember_service,
    set_token,
    tokens_path,
)
from raytrain.cli.commands import _follow, err, out
from raytrain.client import Client
from raytrain.errors import FieldError, NotAuthorizedError, RaytrainError, SpecError
from raytrain.serve.http.auth import operator_token
from raytrain.spec import (
    JobState,
    JobStatus,
    ServiceConfig,
    load_job_spec,
    parse_job_spec,
    spec_error_from_validation,
)


def _service_config(args: argparse.Namespace) -> ServiceConfig:
    """The service's config: a --config YAML if given, then each flag given on top; with
    --cluster-config, the node types the service may buy, each bound to its offer (checked
    before anything starts)."""
    base: dict[str, Any] = {}
    if getattr(args, "config", None):
        base = _read_yaml(Path(args.config), "service config")
        base = _absolute_paths(base, Path(args.config).expanduser().resolve().parent)
    flags = _absolute_paths({
        "state_dir": args.state_dir or os.environ.get(STATE_DIR_ENV) or None,
        "allowed_import_packages": args.allow_import,
        "storage_path": getattr(args, "storage_path", None),
        "storage_endpoint": getattr(args, "storage_endpoint", None),
        "offers_file": getattr(args, "offers_file", None),
        "policy_dir": getattr(args, "policy_dir", None),
        "default_policy": getattr(args, "default_policy", None),
        "auth": False if getattr(args, "no_auth", False) else None,
        "open_metrics": True if getattr(args, "open_metrics", False) else None,
        "http_replicas": getattr(args, "http_replicas", None),
    }, Path.cwd())
    try:
        config = ServiceConfig.model_validate(
            {**base, **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as exc:
        raise spec_error_from_validation(exc, "service config", ServiceConfig) from None
    cluster_path = getattr(args, "cluster_config", None)
    if cluster_path:
        from raytrain.cloud.cluster_configs import (
            load_cluster_config,
            node_type_bindings,
            pod_types,
        )
        from raytrain.spec.files import catalog_for

        document, catalog = load_cluster_config(Path(cluster_path)), catalog_for(config)
        pod_bindings, pods = pod_types(document, catalog)
        update: dict[str, Any] = {
            "node_types": {**node_type_bindings(document, catalog), **pod_bindings},
            "pod_types": pods}
        key = (document.get("auth") or {}).get("ssh_private_key")
        if pods and key:  # `ray up` copies it to the head (~/ray_bootstrap_key.pem)
            update["pod_ssh_private_key"] = str(key)
        config = config.model_copy(update=update)
    return config


def _absolute_paths(values: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths made absolute against `base`: the service's actors run elsewhere."""
    paths = ("state_dir", "storage_path", "offers_file", "policy_dir")
    return {k: str(base / Path(v).expanduser()) if k in paths and isinstance(v, str)
            and "://" not in v and not Path(v).expanduser().is_absolute() else v
            for k, v in values.items()}


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError([FieldError(("config",), f"cannot read {path}: {exc}. To fix: give "
                                    f"the path of a {what} YAML")], what) from None
    if not isinstance(document, dict):
        raise SpecError([FieldError(("config",), f"{path} is not a YAML mapping")], what)
    return document


def _require_resolvable(host: str) -> None:
    """Fail when --host names nothing, before it is taken for a port in use."""
    from raytrain.api_tokens import host_addresses

    try:
        host_addresses(host)
    except (OSError, UnicodeError) as exc:
        raise RaytrainError(
            f"--host {host} does not resolve ({getattr(exc, 'strerror', None) or exc}). To fix: "
            "give an address of this machine (127.0.0.1, or 0.0.0.0 for every interface) or "
            "a name it resolves") from None


def _require_free_port(host: str, port: int) -> None:
    """Fail before anything starts when the service's port is taken."""
    from raytrain.serve.deploy import port_is_free

    if not port_is_free(host, port):
        raise RaytrainError(
            f"port {port} on {host} is already in use. To fix: stop what holds it, "
            "or pass --port"
        )


def _check_storage(config: ServiceConfig) -> None:
    """Fail before anything starts when the job storage cannot be written (a bucket that
    does not exist, no credentials, access denied, an endpoint that does not answer), and
    wait for, or refuse, another service's lease on it (serve.jobs.durable)."""
    import os

    from raytrain.cloud.object_store import is_remote, open_store
    from raytrain.serve.jobs.durable import acquire_lease, service_id

    if not is_remote(config.storage_uri):
        return
    if config.storage_endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = config.storage_endpoint
    with err.status(f"checking {config.storage_uri}"):
        store = open_store(config.storage_uri, check=True)
    acquire_lease(store, service_id(config.state_path), config.storage_lease_s,
                  progress=lambda line: err.print(line, highlight=False, soft_wrap=True))


def what_changed(job: JobStatus) -> tuple[str, str]:
    """What makes a new line on the serve terminal: the job's state and its message's words
    (a queued job's position or a step count moving is not a change worth a line)."""
    return job.state.value, re.sub(r"[0-9][0-9.,]*", "#", job.message or "")


def _watch_until_signal(url: str, token: Callable[[], str | None],
                        interval_s: float = 2.0) -> None:
    """Until SIGINT or SIGTERM, print a line whenever a job appears or changes state. The
    token is read again when the service refuses it (an operator token rotated meanwhile)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    seen: dict[str, tuple[str, str]] = {}
    first = True
    client = Client(url, token=token())
    while not stop.is_set():
        try:
            jobs = client.list()
        except NotAuthorizedError:
            client.close()
            client, jobs = Client(url, token=token()), []
            try:
                jobs = client.list()
            except RaytrainError as still:
                err.print(f"cannot list the jobs to show them here: {escape(str(still))}",
                          highlight=False, soft_wrap=True)
                stop.wait(30 * interval_s)  # said once in a while, not every pass
        except RaytrainError:
            jobs = []
        for job in jobs:
            now = what_changed(job)
            if seen.get(job.id) != now and not (first and job.state.is_terminal):
                detail = job.error if job.state == JobState.FAILED else job.message
                err.print(f"{time.strftime('%H:%M:%S')} job {job.id} ({job.spec.name}) "
                          f"{job.state.value}" + (f": {escape(detail)}" if detail else ""),
                          highlight=False, soft_wrap=True)
            seen[job.id] = now
        first = False
        stop.wait(interval_s)


def cmd_serve(args: argparse.Namespace) -> int:
    from raytrain.serve.detached import DetachedService, detached_service_running

    config = _service_config(args)
    _require_resolvable(args.host)
    if not config.auth and not is_loopback(args.host):
        raise RaytrainError(
            f"a service without tokens may listen on a loopback address only, not {args.host}: "
            "anyone who reaches it could spend this account's money. To fix: drop --no-auth "
            "(clients send the token in tokens.json), or use --host 127.0.0.1")
    if args.detach:
        running = detached_service_running(config.state_path)
        if running is not None:
            raise RaytrainError(
                f"a detached service from {config.state_path} already runs at {running.url}. "
                "To fix: stop it first with `raytrain stop`, or use another --state-dir")
    _require_free_port(args.host, args.port)
    _check_storage(config)
    import ray

    from raytrain.serve.deploy import (
        connect_ray,
        deploy,
        lower_detached_daemons,
        start_detached_head,
        undeploy,
    )

    head_pid = temp_dir = None
    address = args.address
    if args.detach and not address:
        err.print("starting a local Ray cluster that outlives this command ...")
        address, head_pid, temp_dir = start_detached_head(
            None, config.state_path / "ray-head.log", config.state_path)
    # Ray's actors and workers do not stream into this terminal: jobs' output is in their
    # logs (raytrain logs ID) and the operator sees one line per job state change instead.
    started_ray = connect_ray(address, quiet=True, state_dir=config.state_path,
                              local_head=head_pid is not None)
    if head_pid is not None:
        lower_detached_daemons(head_pid)
    try:
        url = deploy(config, args.host, args.port)
        remember_service(args.port, config.state_path)
        err.print(serving_banner(url, config.auth))
        if config.auth:
            err.print(f"API tokens: {tokens_path(config.state_path)} (the CLI and client on "
                      "this machine read it; elsewhere set RAYTRAIN_TOKEN to one of them)",
                      highlight=False, soft_wrap=True)
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
        _watch_until_signal(url, lambda: operator_token(config))
        err.print("stopping the service")
        undeploy(stop_jobs=started_ray)
    except BaseException:
        if head_pid is not None:  # nothing starts half-way: take the cluster down again
            from raytrain.serve.deploy import stop_detached

            DetachedService("", address, head_pid, temp_dir, time.time()).save(
                config.state_path)
            err.print(f"stopped {stop_detached(config.state_path, keep_logs=True)}",
                      highlight=False, soft_wrap=True)
        raise
    finally:
        if started_ray and not args.detach:
            ray.shutdown()
        elif args.detach and ray.is_initialized():
            ray.shutdown()  # disconnect; the cluster and the service stay
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from raytrain.serve.detached import recorded_service

    state_dir = default_state_dir(args.state_dir)
    recorded_service(state_dir)  # nothing to stop: say so before Ray is imported
    from raytrain.serve.deploy import stop_detached

    with err.status("stopping the detached service"):
        what = stop_detached(state_dir)
    err.print(f"stopped {what}", highlight=False)
    return 0


@contextmanager
def _embedded_service(args: argparse.Namespace, purpose: str) -> Iterator[tuple[Client, Any]]:
    """A local Ray cluster and the service on it, for the length of the block: (client,
    config). Everything it started is stopped after, jobs included."""
    from raytrain.serve.deploy import connect_ray, deploy, undeploy

    _require_free_port("127.0.0.1", args.port)
    import ray

    started = time.monotonic()
    config = _service_config(args)
    err.print("starting a local Ray cluster and the raytrain service ...")
    connect_ray(None, quiet=True, state_dir=config.state_path)
    try:
        url = deploy(config, "127.0.0.1", args.port)
        remember_service(args.port, config.state_path)
        err.print(f"service up at {url} after {time.monotonic() - started:.1f} s; {purpose}",
                  soft_wrap=True, highlight=False)
        yield Client(url, token=operator_token(config)), config
    finally:
        undeploy(stop_jobs=True)
        ray.shutdown()


def cmd_demo(args: argparse.Namespace) -> int:
    spec = load_job_spec(args.spec)
    wall_started = time.monotonic()
    with _embedded_service(args, f"submitting {args.spec}") as (client, _):
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run the reference jobs on the embedded service, solve this machine's CPU profile
    from their measured steps (raytrain.core.calibration), store it in the state directory:
    the service and `raytrain plan` plan CPU jobs with it from then on."""
    from raytrain.core.calibration import reference_jobs, solve_profile, steady_step_s
    from raytrain.spec.files import save_cpu_profile

    jobs = [parse_job_spec(document) for document in reference_jobs(args.steps)]
    measured = []
    with _embedded_service(args, f"running {len(jobs)} reference jobs") as (client, config):
        for number, spec in enumerate(jobs, 1):
            err.print(f"job {number} of {len(jobs)}: {spec.name}, {spec.training.steps} steps",
                      highlight=False)
            job = client.submit(spec)
            try:
                status = _follow(client, job.id)
            except BaseException:
                job.cancel()
                raise
            step_s = steady_step_s([e.data for e in client.events(job.id)
                                    if e.type == "progress"])
            client.delete(job.id)  # the reference jobs are not the user's
            if status.state != JobState.SUCCEEDED or step_s is None:
                raise RaytrainError(f"the reference job {spec.name} ended {status.state.value}"
                                    f" without two progress reports to time ({status.error})."
                                    " To fix: run again on an idle machine, or with more "
                                    "--steps")
            measured.append((spec, step_s))
    try:
        profile = solve_profile(measured)
    except ValueError as exc:
        raise RaytrainError(f"{exc}. To fix: run `raytrain calibrate` again on an idle "
                            "machine") from None
    rows = [{"job": spec.name, "measured_s": seconds, "predicted_s": after,
             "catalog_predicted_s": before}
            for (spec, seconds), after, before in zip(measured, profile.predicted_s,
                                                         profile.before_s)]
    path = save_cpu_profile(config.state_path, profile.figures, {
        "measured": rows, "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count()})
    for row in rows:
        out.print(f"{row['job']}: measured {row['measured_s'] * 1e3:.1f} ms per step; "
                  f"predicted {row['predicted_s'] * 1e3:.1f} ms with this profile, "
                  f"{row['catalog_predicted_s'] * 1e3:.1f} ms with the catalog's", highlight=False)
    figures = profile.figures
    out.print(f"this machine: {figures['fp32_flops'] / 1e9:.1f} GFLOP/s per rank, "
              f"{figures['block_overhead_s'] * 1e3:.2f} ms per block per micro-batch, "
              f"{figures['step_overhead_s'] * 1e3:.2f} ms per step; stored in {path}. The "
              "service uses it from its next start", highlight=False)
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    """The service reads tokens.json again when it changes: no restart, no job touched."""
    state_dir = default_state_dir(args.state_dir)
    if args.action == "list":
        for name in sorted(read_tokens(state_dir)):
            out.print(name, highlight=False)
        return 0
    if not args.name:
        raise RaytrainError(f"`raytrain token {args.action}` needs the token's name. To fix: "
                            f"e.g. raytrain token {args.action} {OPERATOR}")
    token = set_token(state_dir, args.name, args.action)
    if token is not None:
        out.print(token, highlight=False)
        err.print(f"{args.name}'s token is in {tokens_path(state_dir)}; the service takes it "
                  "within seconds", highlight=False)
    else:
        err.print(f"removed {args.name}'s token; requests with it are refused within seconds",
                  highlight=False)
    return 0


def serving_banner(url: str, auth: bool) -> str:
    """What `raytrain serve` says once the service answers: where, and what needs a token
    (the OpenAPI document, the API docs and /healthz are open: the API's shape is public)."""
    return (f"raytrain is serving at [bold]{url}[/bold] (its OpenAPI document at "
            f"{url}/openapi.json, open to all"
            + ("; every other call but /healthz takes a token)" if auth else ")"))
