"""A live terminal progress bar for a job's event stream: step, loss, tokens/s, ETA.

Used by the CLI (`submit --follow`, `demo`), fed from `Job.wait(on_event=view.update)`; renders
to stderr.

    with JobProgressView(job_id) as view:
        for event in client.events(job_id):
            view.update(event)
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from raytrain.spec import JobEvent


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


class JobProgressView:
    def __init__(self, job_id: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, log_path=False)
        self._progress = Progress(
            TextColumn("[bold]{task.fields[state]:<12}"),
            BarColumn(),
            TextColumn("step {task.fields[steps]}"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s now"),
            TextColumn("ETA {task.fields[eta]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(
            job_id, total=None, state="PENDING", steps="-", loss="-", tps="-", eta="-"
        )

        self._said: tuple[str, Any] | None = None  # the last state line printed

    def __enter__(self) -> JobProgressView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, event: JobEvent) -> None:
        data: dict[str, Any] = event.data
        if event.type == "progress":
            eta = data.get("eta_s")
            self._progress.update(
                self._task,
                total=data["total_steps"],
                completed=data["step"],
                steps=f"{data['step']}/{data['total_steps']}",
                loss=_fmt(data.get("loss"), ".4f"),
                tps=_fmt(data.get("tokens_per_s"), ",.0f"),
                eta="-" if eta is None else f"{eta:.0f}s",
            )
        elif event.type in ("state", "end"):
            self._progress.update(self._task, state=data["state"])
            message = data.get("message")
            said = (data["state"], message)
            if event.type == "state" and said != self._said:  # each change once, RUNNING too
                self._progress.console.log(data["state"] + (f": {message}" if message else ""))
                self._said = said
