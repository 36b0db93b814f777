"""The `raytrain` command line: its arguments and the dispatch to each command (commands.py
talks to a service, service_commands.py starts and stops one, offline_commands.py plans,
prices and replays without one). Exit codes: 0 success, 1 the
job or service failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from rich.markup import escape

from raytrain.cli import commands as command_module
from raytrain.cli.commands import (
    DEMO_SPEC,
    cmd_cancel,
    cmd_delete,
    cmd_follow,
    cmd_list,
    cmd_logs,
    cmd_resume,
    cmd_status,
    cmd_submit,
    err,
)
from raytrain.cli.data_commands import add_data_commands
from raytrain.cli.flags import existing_file, notice_seconds, number, port, whole
from raytrain.cli.offline_commands import cmd_offers, cmd_plan, cmd_simulate
from raytrain.cli.service_commands import (
    cmd_calibrate,
    cmd_demo,
    cmd_serve,
    cmd_stop,
    cmd_token,
)
from raytrain.client import DEFAULT_URL
from raytrain.errors import RaytrainError, SpecError
from raytrain.spec import (
    JobState,
)

TOKEN_HELP = ("API token (default: $RAYTRAIN_TOKEN, or for a service on this machine the "
              "operator token in its state directory: $RAYTRAIN_STATE_DIR, else the one "
              "`serve` noted for that port, else ~/.raytrain)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytrain",
                                     description=(command_module.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--server",
                        help=f"service URL (default: $RAYTRAIN_SERVER or {DEFAULT_URL})")
    parser.add_argument("--token", help=TOKEN_HELP)
    # Global flags are accepted after the command too: each subcommand knows them, and
    # SUPPRESS keeps a subcommand that was not given one from overwriting the global value.
    global_flags = argparse.ArgumentParser(add_help=False)
    global_flags.add_argument("--server", default=argparse.SUPPRESS,
                              help=f"service URL (default: $RAYTRAIN_SERVER or {DEFAULT_URL})")
    global_flags.add_argument("--token", default=argparse.SUPPRESS, help=TOKEN_HELP)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, json_flag: bool = False,
                of_a_service: bool = True) -> argparse.ArgumentParser:
        """A subcommand; `of_a_service`: it talks to a running service (--server, --token),
        rather than starting its own."""
        p = commands.add_parser(name, help=help_text,
                                parents=[global_flags] if of_a_service else [])
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    add_service_commands(command)
    add_job_commands(command)
    add_offline_commands(command)
    add_data_commands(command)
    return parser


# A subcommand's parser: command(name, help_text, json_flag=False, of_a_service=True).
Command = Callable[..., argparse.ArgumentParser]


def with_service(p: argparse.ArgumentParser) -> None:
    """The flags of a command that runs the service itself."""
    p.add_argument("--state-dir", help="job store and checkpoints (default "
                   "$RAYTRAIN_STATE_DIR, else ~/.raytrain)")
    p.add_argument("--config", metavar="YAML", help="a service config file (ServiceConfig); "
                   "flags given override it")
    p.add_argument("--allow-import", action="append", metavar="PACKAGE",
                   help="allow jobs to import factories from PACKAGE (repeatable)")


def add_service_commands(command: Command) -> None:
    """demo, calibrate, serve, token and stop: the service on this machine."""
    demo = command("demo", "train the demo job on an embedded local Ray", of_a_service=False)
    demo.add_argument("--spec", default=str(DEMO_SPEC),
                      help="job spec (default: examples/demo.yaml)")
    demo.add_argument("--port", type=port, default=8000,
                      help="the embedded service's port on 127.0.0.1 (default 8000)")
    with_service(demo)
    demo.set_defaults(func=cmd_demo)

    calibrate = command("calibrate", "measure this machine's CPU profile as the service runs "
                        "jobs, and store it for the planner (about 3 minutes)",
                        of_a_service=False)
    calibrate.add_argument("--steps", type=whole(at_least=20, at_most=100_000), default=300,
                           help="steps of each tiny reference job (default 300)")
    calibrate.add_argument("--port", type=port, default=8000,
                           help="the embedded service's port on 127.0.0.1 (default 8000)")
    with_service(calibrate)
    calibrate.set_defaults(func=cmd_calibrate)

    serve = command("serve", "deploy the service on a Ray cluster", of_a_service=False)
    serve.add_argument("--address", help="Ray cluster address (default: start a local one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=port, default=8000,
                       help="the port to listen on (default 8000)")
    serve.add_argument("--detach", action="store_true", help="leave it running and return; "
                       "`raytrain stop` stops it")
    serve.add_argument("--cluster-config", metavar="YAML", type=existing_file,
                       help="the cluster's launcher YAML: the service buys its worker node "
                       "types through Ray's autoscaler (default: a fixed cluster)")
    serve.add_argument("--storage-path", help="checkpoints, logs and a copy of the job "
                       "records: a folder every node reaches, or s3://BUCKET/PREFIX "
                       "(default: <state-dir>/jobs)")
    serve.add_argument("--storage-endpoint", metavar="URL", help="endpoint of an "
                       "S3-compatible store (R2, B2, MinIO; default: AWS_ENDPOINT_URL_S3, "
                       "AWS_ENDPOINT_URL, else AWS)")
    serve.add_argument("--offers-file", type=existing_file,
                       help="offer catalog to use instead of the cached one")
    serve.add_argument("--policy-dir", help="folder of named policies (default: policies/)")
    serve.add_argument("--default-policy", help="policy of jobs that name none (cost-first)")
    serve.add_argument("--no-auth", action="store_true", help="serve without tokens (only on a "
                       "loopback --host)")
    serve.add_argument("--open-metrics", action="store_true", help="serve /metrics without a "
                       "token")
    serve.add_argument("--http-replicas", type=int, default=None, metavar="N",
                       help="copies of the HTTP API (default 1; 2 on a cluster, so losing one "
                       "costs clients no wait)")
    with_service(serve)
    serve.set_defaults(func=cmd_serve)

    tokens = command("token", "list, add, rotate or remove the service's API tokens")
    tokens.add_argument("action", choices=["list", "add", "rotate", "remove"])
    tokens.add_argument("name", nargs="?", help="the token's name (add, rotate, remove); "
                        "its jobs record it as who submitted them")
    tokens.add_argument("--state-dir", help="the service's state directory (default "
                        "$RAYTRAIN_STATE_DIR, else ~/.raytrain)")
    tokens.set_defaults(func=cmd_token)

    stop = command("stop", "stop what `raytrain serve --detach` started, and nothing else")
    stop.add_argument("--state-dir", help="the state directory the service was started "
                      "with (default $RAYTRAIN_STATE_DIR, else ~/.raytrain)")
    stop.set_defaults(func=cmd_stop)


def add_job_commands(command: Command) -> None:
    """submit, status, list, cancel, resume, delete and logs: jobs on a service."""
    submit = command("submit", "queue a job from a YAML/JSON file", json_flag=True)
    submit.add_argument("file")
    submit.add_argument("--follow", action="store_true", help="show progress until the job ends")
    submit.set_defaults(func=cmd_submit)

    status = command("status", "one job's status", json_flag=True)
    status.add_argument("id")
    status.add_argument("--steps", action="store_true",
                        help="every step's loss, validation loss, learning rate, gradient "
                        "norm and tokens (from the job's history) instead of the status")
    status.add_argument("--follow", action="store_true", help="show progress until the job "
                        "ends (as `raytrain follow ID`)")
    status.set_defaults(func=cmd_status)

    follow = command("follow", "show a job's progress until it ends, then its summary",
                     json_flag=True)
    follow.add_argument("id")
    follow.set_defaults(func=cmd_follow)

    listing = command("list", "all jobs, oldest first", json_flag=True)
    listing.add_argument("--state", action="append", type=str.upper,
                         choices=[state.value for state in JobState],
                         help="only jobs in this state (repeatable)")
    listing.set_defaults(func=cmd_list)

    cancel = command("cancel", "cancel a job", json_flag=True)
    cancel.add_argument("id")
    cancel.set_defaults(func=cmd_cancel)

    resume = command("resume", "go on from a failed or cancelled job's latest checkpoint, as a "
                     "new job", json_flag=True)
    resume.add_argument("id")
    resume.add_argument("--budget-usd", type=float, default=None,
                        help="the new job's budget (default: the old job's)")
    resume.add_argument("--follow", action="store_true", help="show the new job's progress "
                        "until it ends")
    resume.set_defaults(func=cmd_resume)

    delete = command("delete", "forget an ended job and delete its checkpoints and logs",
                     json_flag=True)
    delete.add_argument("id")
    delete.add_argument("--yes", action="store_true",
                        help="delete without asking (needed when no one can be asked)")
    delete.set_defaults(func=cmd_delete)

    logs = command("logs", "each worker's output of a job, by rank")
    logs.add_argument("id")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new output "
                      "until the job ends")
    logs.add_argument("--rank", type=whole(at_least=0), help="only this rank")
    logs.set_defaults(func=cmd_logs)


def add_plan_command(command: Command) -> None:
    """plan: rank layouts, or evaluate one, offline."""
    planning = command("plan", "rank the parallel layouts of a job spec on some hardware "
                       "(offline)", json_flag=True)
    planning.add_argument("file", nargs="?", help="the job spec (optional with "
                          "--model-config)")
    planning.add_argument("--model-config", help="a Hugging Face config.json whose model "
                          "shape is planned (hidden_size, num_hidden_layers, ...), in place "
                          "of the spec's model")
    planning.add_argument("--seq-len", type=whole(at_least=2),
                          help="tokens per sequence, without a spec (default 4096, or the "
                          "model's longest if shorter)")
    planning.add_argument("--global-batch", type=whole(at_least=1),
                          help="sequences per optimizer step, without a spec (default 512)")
    planning.add_argument("--gpus", type=whole(at_least=1, at_most=1_000_000),
                          help="devices (default: resources.num_workers)")
    planning.add_argument("--gpu", help="device kind, e.g. h100-sxm, rtx4090 (default: "
                          "resources.accelerator, or cpu)")
    planning.add_argument("--price", type=number(at_least=0),
                          help="USD per device-hour, for $/M tokens")
    planning.add_argument("--top", type=whole(at_least=1), default=10,
                          help="plans to show (default 10)")
    planning.add_argument("--layout", help="evaluate this layout only: "
                          "dp_replicate=D,dp_shard=S,tp=T,pp=P[,vp=V][,mb=B]"
                          "[,recompute=full|selective][,rs_once=1] (degrees left out are 1; "
                          "their product is the device count)")
    planning.add_argument("--shape", help="node shape: p4d, p4de, p5, p5e, dgx-a100, "
                          "dgx-h100, ... or an offer, e.g. runpod/secure/8x-rtx4090")
    planning.add_argument("--shape-file", help="YAML describing your own node: gpu, "
                          "gpus_per_node, intra_link or intra_gbytes_per_s, "
                          "inter_gbits_per_gpu, rdma")
    planning.add_argument("--precision", choices=("fp32", "bf16", "fp8"),
                          help="default: the spec's, else bf16 on GPUs that have it")
    planning.add_argument("--state-dir", help="where `raytrain calibrate` stored this "
                          "machine's CPU profile, if it has (default $RAYTRAIN_STATE_DIR, "
                          "else ~/.raytrain)")
    planning.set_defaults(func=cmd_plan)


def add_offline_commands(command: Command) -> None:
    """plan, offers and simulate: no service needed."""
    add_plan_command(command)
    offering = command("offers", "instance offers and prices; with a job file, the policy's "
                       "ranking", json_flag=True)
    offering.add_argument("file", nargs="?", help="a job spec to rank the offers for")
    offering.add_argument("--policy", help="policy name (default: the job's, else cost-first)")
    offering.add_argument("--refresh", action="store_true",
                          help="refresh AWS prices and facts through boto3 first")
    offering.add_argument("--region", default="us-east-1", help="AWS region to refresh")
    offering.add_argument("--endpoint-url", help="EC2 endpoint (default: AWS's)")
    offering.add_argument("--state-dir", help="where the cache lives (default "
                          "$RAYTRAIN_STATE_DIR, else ~/.raytrain)")
    offering.add_argument("--top", type=whole(at_least=1), default=10,
                          help="options to show (default 10)")
    offering.set_defaults(func=cmd_offers)

    simulating = command("simulate", "replay spot preemption traces: on-demand, spot, "
                         "failover, Uniform Progress, the policy and the hindsight-optimal",
                         json_flag=True)
    simulating.add_argument("--trace", action="append", type=existing_file,
                            help="trace file (repeatable; default "
                            "the shipped bamboo/p3-trace.csv)")
    simulating.add_argument("--instance", default="p3.2xlarge", help="offer's instance type")
    simulating.add_argument("--nodes", type=whole(at_least=1, at_most=10_000), default=8)
    simulating.add_argument("--work-hours", type=number(above=0, at_most=24 * 365), default=6.0,
                            help="hours of training on those nodes without interruption")
    simulating.add_argument("--deadline-hours", type=number(above=0, at_most=24 * 365),
                            default=12.0)
    simulating.add_argument("--policy", default=None, help="policy name (default cost-first)")
    simulating.add_argument("--notice-s", type=notice_seconds, action="append",
                            help="seconds of notice before a preemption, or 'cloud' for the "
                            "offer's cloud's (AWS 120 s, GCP 30 s, RunPod none, each to a share "
                            "of preemptions); repeatable to compare (default: cloud)")
    simulating.add_argument("--notice-share", type=number(at_least=0, at_most=1),
                            help="share of preemptions a --notice-s in seconds comes with "
                            "(default 1)")
    simulating.add_argument("--interval-s", type=number(above=0), default=1800.0,
                            help="checkpoint interval of the spot and failover strategies")
    simulating.add_argument("--checkpoint-s", type=number(at_least=0), default=60.0,
                            help="seconds one checkpoint stalls training (the cloud's truth, "
                            "which the replayed service measures)")
    simulating.add_argument("--restart-s", type=number(at_least=0), default=30.0,
                            help="seconds from nodes up to the first training step")
    simulating.add_argument("--ready-s", type=number(at_least=0), default=120.0,
                            help="seconds from asking for a node to its being up")
    simulating.add_argument("--starts", type=whole(at_least=1, at_most=100_000), default=11,
                            help="start times per trace, spread over its span")
    simulating.add_argument("--processes", type=whole(at_least=1, at_most=256), default=None,
                            help="replay start times in this many processes (default: one "
                            "per CPU this process may use)")
    simulating.add_argument("--state-dir", help="offer cache (default $RAYTRAIN_STATE_DIR, "
                            "else ~/.raytrain)")
    simulating.set_defaults(func=cmd_simulate)


# What the `server` extra installs (pyproject.toml): a client-only install lacks them.
SERVER_PACKAGES = frozenset({"torch", "ray", "fastapi", "starlette", "uvicorn", "numpy",
                             "psutil", "boto3", "botocore", "prometheus_client", "torchft",
                             "tokenizers", "safetensors"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        message = (f"`raytrain {args.command}` runs the service or training on this machine, "
                   f"and this install has the client only (no module named {exc.name!r}). To "
                   "fix: install the server extra from a clone of raytrain, pip install "
                   "'.[server]' there (with torch==2.13.0 on a machine without a GPU)")
        err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
        return 1
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
