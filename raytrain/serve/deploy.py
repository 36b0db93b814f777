"""Start and stop the service on a Ray cluster: the effects behind `raytrain serve`, `stop`
and `demo`.

    started_ray = connect_ray(address=None)       # a local cluster when no address is given
    url = deploy(ServiceConfig(), host="127.0.0.1", port=8000)
    undeploy(stop_jobs=True)

`serve --detach` without an address cannot start Ray inside the CLI's own process (that
cluster would end with the process): it starts a head node as its own process group
(`ray start --head --block`, `start_detached_head`) and records what it started in
`<state_dir>/service.json`, which `raytrain stop` reads to stop exactly that and nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import psutil
import ray
from ray import serve

from raytrain.errors import RaytrainError
from raytrain.serve.adaptors.ray_probe import environment, install_no_cloud_probe
from raytrain.serve.deploy_failure import deploy_failure, replica_errors
from raytrain.serve.detached import (
    SERVICE_RECORD,
    head_process,
    recorded_service,
    terminate_family,
)
from raytrain.serve.http.app import APP_NAME
from raytrain.serve.http.auth import operator_token
from raytrain.serve.http.front import serve_app
from raytrain.serve.jobs.actor import find_manager
from raytrain.spec import ServiceConfig

logger = logging.getLogger(__name__)


# Ray's one-machine mode (its default on macOS and Windows), for a cluster `ray.init` starts
# here: every process of it takes the loopback as the node's address, instead of finding the
# machine's own by opening a UDP socket towards 8.8.8.8 (Ray's C++ core, in every process but
# the driver), whose reverse lookups by the training ranks then ask the network's DNS. Its
# raylets refuse to join another cluster, which none of such a cluster does. The detached
# head `serve --detach` starts takes it too (without it, Ray turns its --node-ip-address
# 127.0.0.1 into the machine's outward address): every raytrain process that connects to that
# head (`serve --detach` itself, `raytrain stop`) connects in the same mode, as a driver in
# the other mode would wait for a node at its own outward address forever.
ONE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def neutral_directory(folder: Path | str | None = None) -> Iterator[str]:
    """Run the block from `folder` (default: an empty folder of this user's in the system's
    temporary directory), and come back after.

    `ray.init` adds the driver's working directory to the import path of every worker the
    job starts (`JobConfig._py_driver_sys_path`), and Serve's controller and replicas keep
    the job config of the driver that started them: run from a folder holding a `raytrain/`
    folder (the parent of a clone) or a user's `mylab/`, the workers imported that folder
    instead of the installed package. From an empty folder, workers import only what is
    installed, whatever the directory `raytrain` was started from."""
    here = os.getcwd()
    target = Path(folder) if folder is not None else \
        Path(tempfile.gettempdir()) / f"raytrain-cwd-{os.getuid()}"
    target.mkdir(parents=True, exist_ok=True)
    os.chdir(target)
    try:
        yield str(target)
    finally:
        os.chdir(here)


@contextmanager
def one_machine() -> Iterator[None]:
    """Ray's one-machine mode for the cluster started inside the block (an operator's setting
    wins): in the environment the cluster's processes inherit, and in this process, whose Ray
    read it when it was imported (`ray._private.ray_constants`, private: no public API sets it;
    tests/service/test_ray_private.py fails when it moves). Both are put back after, so that a
    `ray start` this process runs later (a worker node) is not refused."""
    from ray._private import ray_constants

    value, flag = os.environ.get(ONE_MACHINE, "0"), ray_constants.ENABLE_RAY_CLUSTER
    with environment({ONE_MACHINE: value}):
        ray_constants.ENABLE_RAY_CLUSTER = value.lower() in ("1", "true")
        try:
            yield
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = flag


def connect_ray(address: str | None, num_cpus: int | None = None, quiet: bool = False,
                state_dir: Path | None = None, local_head: bool = False) -> bool:
    """Connect to the cluster at `address`, or start a local one; True if we started it.

    quiet: do not stream worker logs to this process (the demo draws a progress bar instead;
    a failed job's error is in its status). state_dir: a local cluster keeps Ray's session
    folders (its logs) there (`ray_folder`), not in /tmp/ray. local_head: `address` is a head
    `start_detached_head` started (one-machine mode, as it runs)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return False
    if address:
        try:
            with neutral_directory(), (one_machine() if local_head else nullcontext()):
                ray.init(address=address, logging_level=logging.WARNING,
                         log_to_driver=not quiet)
        except ConnectionError as exc:
            raise RaytrainError(
                f"cannot connect to the Ray cluster at {address}: {exc}. To fix: check the "
                "address (ray status on the head node prints it), or leave out --address "
                "to start a local cluster"
            ) from None
        return False
    # Ray's usage statistics probe the cloud metadata address (169.254.169.254) and report to
    # Ray's servers: a cluster raytrain starts on this machine talks to nothing beyond it.
    # An operator's own setting wins.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Serve's controller reconciles every 0.1 s by default: on a small head node that is a
    # measurable share of the CPU training wants (BENCHMARKS.md, background CPU), and a
    # training service redeploys rarely. Only for clusters we start; an operator's wins.
    os.environ.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "1.0")
    temp_dir = None if state_dir is None else ray_folder(state_dir)
    # ... and neither does Ray's dashboard process (raytrain.serve.adaptors.ray_probe).
    install_no_cloud_probe(Path(temp_dir) if temp_dir else
                           Path(tempfile.gettempdir()) / f"raytrain-{os.getuid()}")
    with one_machine(), neutral_directory():
        ray.init(
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=not quiet,
            _temp_dir=temp_dir,
        )
    _lower_ray_daemons(psutil.Process())
    return True


# Processes of a local cluster that serve Ray itself rather than run tasks.
_DAEMONS = ("gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
_DAEMON_SCRIPTS = ("autoscaler/_private/monitor.py", "dashboard/dashboard.py", "log_monitor.py")


def _lower_ray_daemons(root: psutil.Process, niceness: int = 10) -> None:
    """Run the GCS, agents, monitor and log monitor of a cluster we started at `niceness`.

    Training ranks run at 0 (launcher.py) and Ray's workers for the service at 15. Ray's
    daemons start at 0, level with the ranks, so on a small machine whose cores the ranks
    fill, their periodic work stalls a rank while its peers wait at the next collective;
    below the ranks it runs in the gaps instead. The raylet keeps 0: every worker it starts
    inherits its priority."""
    for child in root.children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            if child.name() in _DAEMONS or any(script in command for script in _DAEMON_SCRIPTS):
                child.nice(niceness)
        except psutil.Error:  # gone, or not ours to change: leave it
            continue


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def deploy(config: ServiceConfig, host: str, port: int, timeout_s: float = 120.0,
           serving: Any = serve, application: Callable[..., Any] = serve_app) -> str:
    """Deploy the HTTP app on the connected cluster and wait until it is ready (GET /readyz);
    return its URL. `serving`: Ray Serve's API (start, run), and `application` the app it
    runs (raytrain.serve.http.front.serve_app)."""
    # Serve's driver-side notices ("Started Serve", "New http_options will not be applied",
    # which serve.run says of the options serve.start just set) are not an operator's news.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    # The operator token is written before anything answers: a script that waits for
    # /healthz then reads tokens.json finds it.
    token = operator_token(config)
    # The replicas serve HTTP themselves (serve.http.front): Serve runs no proxy.
    serving.start(
        proxy_location="Disabled",
        logging_config={"log_level": "WARNING", "enable_access_log": False},
    )
    try:
        serving.run(application(config, host, port), name=APP_NAME, route_prefix=None)
    except RuntimeError as exc:  # Serve says only that the deployment failed, not why
        if "Deploying application" not in str(exc):
            raise
        raise RaytrainError(deploy_failure(str(exc), replica_errors(APP_NAME))) from None
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # Ready, not just alive: the job manager answers and its store takes writes.
            if httpx.get(f"{url}/readyz", headers=headers, timeout=10.0).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RaytrainError(f"the service did not answer at {url} within {timeout_s:.0f} s")
        time.sleep(0.2)


def undeploy(stop_jobs: bool) -> None:
    """Remove the HTTP app; with stop_jobs (a cluster the service started, about to be shut
    down with Serve on it), stop the job manager and its running jobs instead: each job's
    state is saved, and the cluster's end takes the HTTP app with it. (Shutting Serve down
    first kills its controller in the middle of its own graceful shutdown, which Ray reports
    as an error in the operator's terminal.)"""
    if not stop_jobs:  # a cluster others may use: take away our app only
        serve.delete(APP_NAME, _blocking=True)
        return
    manager = find_manager()
    if manager is not None:
        try:
            ray.get(manager.shutdown.remote(), timeout=30)
        finally:
            ray.kill(manager, no_restart=True)


# Ray's session folders hold its Unix sockets, whose paths may not exceed 107 bytes on
# Linux: the folder, then "/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store"
# (up to 64 bytes).
RAY_FOLDER_MAX_BYTES = 40
KEEP_RAY_SESSIONS = 5  # finished sessions' folders kept (their logs), newest first


def ray_folder(state_dir: Path) -> str:
    """Where a Ray cluster raytrain starts keeps its session folders (logs, sockets): the state
    directory's `ray` folder, or, when that path is too long for Ray's sockets, a short folder
    in the system's temporary directory that `ray` in the state directory links to. Finished
    sessions beyond the newest KEEP_RAY_SESSIONS are removed; a session a process still uses
    (its path in the process's command line) never is."""
    state_dir = Path(os.path.abspath(state_dir))
    wanted = state_dir / "ray"
    if len(os.fsencode(str(wanted))) <= RAY_FOLDER_MAX_BYTES:
        folder = wanted
    else:
        digest = hashlib.sha256(os.fsencode(str(state_dir))).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"raytrain-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    if folder != wanted and (wanted.is_symlink() or not wanted.exists()):
        wanted.unlink(missing_ok=True)
        wanted.parent.mkdir(parents=True, exist_ok=True)
        wanted.symlink_to(folder, target_is_directory=True)
    _prune_sessions(folder)
    return str(folder)


def _prune_sessions(folder: Path) -> None:
    sessions = sorted((p for p in folder.glob("session_2*") if p.is_dir() and not p.is_symlink()),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    if len(sessions) <= KEEP_RAY_SESSIONS:
        return
    for session in sessions[KEEP_RAY_SESSIONS:]:
        if not _processes_naming(session.name):
            shutil.rmtree(session, ignore_errors=True)


def _processes_naming(text: str) -> list[psutil.Process]:
    """The processes whose command line names `text` (a Ray session's folder, say)."""
    return [p for p in psutil.process_iter(["cmdline"])
            if text in " ".join(p.info.get("cmdline") or [])]


def start_detached_head(num_cpus: int | None, log_path: Path, state_dir: Path,
                        timeout_s: float = 120.0) -> tuple[str, int, str]:
    """Start a local Ray head node that outlives this process; return (address, pid,
    temp_dir). Its processes form their own session, so a Ctrl-C in this terminal does not
    reach them, and `raytrain stop` ends them by signalling the head's process. Its session
    folder is in `ray_folder(state_dir)`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    temp_dir = ray_folder(state_dir)
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    env.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "1.0")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # as connect_ray: nothing beyond this machine
    env[ONE_MACHINE] = os.environ.get(ONE_MACHINE, "0")  # on loopback (one_machine)
    # Ray's CLI, with its dashboard's cloud probe held at home (raytrain.serve.adaptors.ray_probe)
    command = [sys.executable, "-m", "raytrain.serve.adaptors.ray_probe", temp_dir, "start",
               "--head",
               f"--port={port}", "--node-ip-address=127.0.0.1",
               f"--num-cpus={num_cpus or os.cpu_count() or 2}", "--include-dashboard=false",
               "--disable-usage-stats", f"--temp-dir={temp_dir}", "--block"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # From the Ray folder: its workers start in the raylet's directory, never in a
        # user's folder holding packages of the same names as installed ones.
        head = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=temp_dir)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while not _gcs_answers(port):
        if head.poll() is not None:
            raise RaytrainError(f"Ray's head node did not start (exit {head.returncode}); its "
                                f"output is in {log_path}. To fix: read it, or start Ray "
                                "yourself (ray start --head) and pass --address")
        if time.monotonic() > deadline:
            terminate_family(psutil.Process(head.pid))
            raise RaytrainError(f"Ray's head node did not start within {timeout_s:.0f} s; "
                                f"its output is in {log_path}")
        time.sleep(0.5)
    return address, head.pid, _session_of(head.pid, temp_dir)


def _session_of(head_pid: int, temp_dir: str) -> str:
    """The session folder of the head started as `head_pid` in `temp_dir` (its processes name
    it on their command lines), so that `raytrain stop` ends and removes exactly that session;
    `temp_dir` itself if none says yet."""
    marker = os.path.join(temp_dir, "session_")
    try:
        family = [psutil.Process(head_pid), *psutil.Process(head_pid).children(recursive=True)]
    except psutil.Error:
        return temp_dir
    for process in family:
        try:
            words = process.cmdline()
        except psutil.Error:
            continue
        for word in words:
            at = word.find(marker)
            if at >= 0:
                name = word[at + len(marker):].split("/")[0]
                if name and name != "latest":
                    return str(marker + name)
    return temp_dir


def _gcs_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def lower_detached_daemons(head_pid: int) -> None:
    try:
        _lower_ray_daemons(psutil.Process(head_pid))
    except psutil.Error:
        pass


def stop_detached(state_dir: Path, keep_logs: bool = False) -> str:
    """Stop what `serve --detach` recorded in `state_dir`; say what was stopped. With
    `keep_logs` (a start that failed), Ray's session folder stays, its logs in it."""
    record = recorded_service(state_dir)
    head = head_process(record)
    stopped = []
    # Ray's daemons and actors take 10-30 s to leave on SIGTERM. Once the job manager has
    # saved every job, nothing of ours is left in them, so they get a short grace; when it
    # could not be reached, the full one, in case it is still saving.
    grace_s = 30.0
    if head is not None or record.head_pid is None:
        try:  # let the job manager save every running job's state before the cluster goes
            connect_ray(record.address, quiet=True, local_head=record.head_pid is not None)
            undeploy(stop_jobs=record.head_pid is not None)
            stopped.append("the service" + (f" at {record.url}" if record.url else ""))
            grace_s = 5.0
        except Exception as exc:  # noqa: BLE001 - a dead or half-dead cluster: stop it anyway
            logger.warning("could not stop the service cleanly: %s", exc)
        finally:
            if ray.is_initialized():
                ray.shutdown()
    if head is not None:
        terminate_family(head, timeout_s=grace_s)
        stopped.append(f"the Ray cluster it started at {record.address}")
    if record.temp_dir:
        for proc in _processes_naming(record.temp_dir):
            terminate_family(proc, timeout_s=5.0)
        if keep_logs:
            stopped.append(f"kept its logs in {record.temp_dir}/logs")
        else:
            shutil.rmtree(record.temp_dir, ignore_errors=True)
    (state_dir / SERVICE_RECORD).unlink(missing_ok=True)
    return " and ".join(stopped) if stopped else "nothing was running any more"
