"""`raytrain ...`: a thin command line over the client and the service's deploy helpers.

    raytrain demo                         train examples/demo.yaml on an embedded local Ray
    raytrain serve [--address ADDR]       deploy the service; foreground until SIGINT/SIGTERM
    raytrain submit job.yaml --follow     queue a job and follow it to the end
    raytrain status ID | list | cancel ID [--json]
    raytrain logs ID [--follow]           each worker's output, by rank
    raytrain delete ID                    forget an ended job and delete its checkpoints
    raytrain stop                         stop what `raytrain serve --detach` started
    raytrain plan job.yaml --gpus 16 --gpu rtx4090   rank parallel layouts (offline)
    raytrain plan job.yaml --shape p5 --layout dp_shard=8,tp=8   that one layout, there
    raytrain offers [job.yaml] [--refresh]           offers, prices, the policy's ranking
    raytrain simulate [--trace FILE]                 replay spot traces under six strategies

The server URL comes from --server (before or after the command), else RAYTRAIN_SERVER, else
http://127.0.0.1:8000.
Exit codes: 0 success, 1 the job or service failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from raytrain.cli.local_paths import absolute_paths
from raytrain.cli.progress_view import JobProgressView
from raytrain.cli.views import (
    jobs_table,
    status_table,
    steps_table,
    summary_table,
)
from raytrain.client import DEFAULT_URL, Client
from raytrain.errors import RaytrainError
from raytrain.spec import (
    JobState,
    JobStatus,
)
from raytrain.spec.files import EXAMPLES_DIR
from raytrain.spec.job import read_document

out = Console()
# Errors and warnings are not broken into lines at 80 columns when stderr is not a terminal:
# a path or a `raytrain ...` command in one stays whole for a log, a grep or a copy.
err = Console(stderr=True, soft_wrap=True)

DEMO_SPEC = EXAMPLES_DIR / "demo.yaml"


# ---------------------------------------------------------------------------------- helpers


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server or os.environ.get("RAYTRAIN_SERVER") or DEFAULT_URL,
                  token=getattr(args, "token", None))


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def _follow(client: Client, job_id: str, json_output: bool = False) -> JobStatus:
    """Draw progress until the job ends, then its summary (on stderr when stdout is JSON)."""
    started = time.monotonic()
    with JobProgressView(job_id) as view:
        status = client.job(job_id).wait(on_event=view.update)
    console = err if json_output else out
    console.print(summary_table(status, time.monotonic() - started))
    _print_checkpoint_path(console, status)
    return status


def _print_checkpoint_path(console: Any, job: JobStatus) -> None:
    """The job's checkpoint path whole, on one line however narrow the terminal: to copy."""
    if job.checkpoint:
        console.print(f"checkpoint path: {job.checkpoint.path}", soft_wrap=True,
                      highlight=False)


def _follow_or_leave(client: Client, job_id: str, json_output: bool = False) -> JobStatus:
    """`_follow`, and on Ctrl-C say that the job goes on and how to stop it."""
    try:
        return _follow(client, job_id, json_output)
    except KeyboardInterrupt:
        err.print(f"\nstopped following job {job_id}; it goes on in the service. Follow it "
                  f"again with `raytrain follow {job_id}` or `raytrain logs {job_id} --follow`, "
                  f"or stop it with `raytrain cancel {job_id}`.", highlight=False)
        raise


# --------------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace) -> int:
    client = _client(args)
    document = absolute_paths(read_document(Path(args.file), "job spec"), client.url,
                              Path.cwd())
    job = client.submit(document)
    if args.json and not args.follow:
        print_json(job.status().model_dump(mode="json"))
        return 0
    err.print(f"submitted job [bold]{job.id}[/bold]")
    if not args.follow:
        out.print(job.id)
        return 0
    return _followed(client, job.id, args.json)


def _followed(client: Client, job_id: str, json_output: bool) -> int:
    """Follow a job to its end (`--follow`, `raytrain follow`): 0 if it succeeded."""
    status = _follow_or_leave(client, job_id, json_output=json_output)
    if json_output:
        print_json(status.model_dump(mode="json"))
    return 0 if status.state == JobState.SUCCEEDED else 1


def cmd_follow(args: argparse.Namespace) -> int:
    return _followed(_client(args), args.id, args.json)


def cmd_status(args: argparse.Namespace) -> int:
    if args.follow:
        return _followed(_client(args), args.id, args.json)
    if args.steps:
        history = _client(args).history(args.id)
        if args.json:
            print_json([step.model_dump(mode="json") for step in history.steps])
        else:
            validation = {point.val_step: point.val_loss for point in history.points
                          if point.val_step is not None and point.val_loss is not None}
            out.print(steps_table(history.steps, validation))
        return 0
    job = _client(args).get(args.id)
    if args.json:
        print_json(job.model_dump(mode="json"))
    else:
        out.print(status_table(job))
        _print_checkpoint_path(out, job)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list(states=args.state)
    if args.json:
        print_json([job.model_dump(mode="json") for job in jobs])
    else:
        out.print(jobs_table(jobs))
    return 0


def _print_job(args: argparse.Namespace, job: JobStatus, line: str) -> int:
    """A job's status as JSON with --json, else one line about it."""
    if args.json:
        print_json(job.model_dump(mode="json"))
    else:
        out.print(line)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _client(args).cancel(args.id)
    return _print_job(args, job, f"job {job.id} {job.state.value}")


def cmd_resume(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.get(client.resume(args.id, args.budget_usd).id)
    if not args.json:  # the id alone on stdout, as submit prints it: R=$(raytrain resume ID)
        err.print(f"job [bold]{job.id}[/bold] queued, going on from {args.id}'s checkpoint "
                  f"{job.spec.training.resume_from}", soft_wrap=True)
    if args.follow:
        return _followed(client, job.id, args.json)
    return _print_job(args, job, job.id)


def cmd_delete(args: argparse.Namespace) -> int:
    """Checkpoints cannot be brought back: ask first, unless --yes."""
    client = _client(args)
    if not args.yes:
        status = client.get(args.id)  # a job that does not exist is said so before asking
        where = f" at {status.checkpoint.path}" if status.checkpoint else ""
        if not sys.stdin.isatty():
            raise RaytrainError(f"deleting job {args.id} removes its checkpoints{where} and "
                                "logs for good. To fix: add --yes")
        answer = input(f"delete job {args.id} ({status.spec.name}, {status.state}) with its "
                       f"checkpoints{where} and logs? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            err.print("nothing deleted")
            return 1
    job = client.delete(args.id)
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


