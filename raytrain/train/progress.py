"""Progress from rank 0 to the job manager: step, loss, tokens/s, elapsed, ETA.

`ray.train.report()` blocks for a controller poll (about 2 s), so per-step progress goes
through a cheaper channel: a fire-and-forget call on the job manager actor, at most every
`interval_s` (1 s by default) and always for the first and last step. The meter measures
throughput over the steps since the previous publication, which is what a progress bar wants,
and the seconds per step in the same window without its checkpoint saves, which is what the
planner's predicted step time is compared with.

Every step's figures (loss, learning rate, gradient norm, tokens) ride in the next
publication as `steps`, however many steps it covers, so the job's history holds every step
at one message a second.

    meter = ProgressMeter(total_steps=100, tokens_per_step=2048, start_step=0, clock=time.monotonic)
    meter.add_step(step, loss, lr, grad_norm)
    if meter.record(step, loss): sink.progress(meter.snapshot())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol


class ProgressSink(Protocol):
    def started(self, resumed_step: int) -> None: ...

    def progress(self, payload: dict[str, Any]) -> None: ...

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        """Checkpoint `path` at `step` is durable: training stalled `save_s` for it, and it
        was committed `durable_s` after the save began."""

    def finished(self, result: dict[str, Any]) -> None: ...

    def should_stop(self) -> bool:
        """True once the service asked the job to stop (cancel); must not block."""
        ...

    def should_move(self) -> bool:
        """True once the service asked the job to checkpoint and stop, to resume on other
        capacity; must not block."""
        ...

    def checkpoint_every_s(self) -> float | None:
        """The service's checkpoint interval for the capacity the job holds (the policy's,
        for its preemption risk); None: only every checkpoint_every_steps. Must not block."""
        ...


@dataclass
class ServiceAnswer:
    """What the service has answered rank 0's reports so far (the lifecycle's progress
    reply): stop, move, and how often to checkpoint."""

    stop: bool = False
    move: bool = False
    checkpoint_every_s: float | None = None

    def take(self, reply: dict[str, Any]) -> None:
        self.stop = self.stop or bool(reply.get("stop"))
        self.move = self.move or bool(reply.get("move"))
        if "checkpoint_every_s" in reply:
            self.checkpoint_every_s = reply["checkpoint_every_s"]


class AnsweredSink:
    """A rank 0 sink whose service answers come back in their own time: each question reads
    the latest answer, after `_poll` took in what has arrived (never waiting)."""

    answer: ServiceAnswer

    def _poll(self) -> None:
        raise NotImplementedError

    def should_stop(self) -> bool:
        self._poll()
        return self.answer.stop

    def should_move(self) -> bool:
        self._poll()
        return self.answer.move

    def checkpoint_every_s(self) -> float | None:
        self._poll()
        return self.answer.checkpoint_every_s


class NullSink:
    """For ranks other than 0, and runs nobody watches."""

    def started(self, resumed_step: int) -> None:
        pass

    def progress(self, payload: dict[str, Any]) -> None:
        pass

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        pass

    def finished(self, result: dict[str, Any]) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def should_move(self) -> bool:
        return False

    def checkpoint_every_s(self) -> float | None:
        return None


class ProgressMeter:
    def __init__(
        self,
        total_steps: int,
        tokens_per_step: int,
        start_step: int,
        clock: Callable[[], float],
        interval_s: float = 1.0,
        first_loss: float | None = None,
    ) -> None:
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.clock = clock
        self.interval_s = interval_s
        self.started_at = clock()
        self.first_loss = first_loss
        self.step = start_step
        self.loss: float | None = None
        self._window_start = (self.started_at, start_step)
        self._last_publish_at = float("-inf")
        self.tokens_per_s: float | None = None
        self.step_s: float | None = None
        self._saving_s = 0.0  # checkpoint saves in the current window
        self._data_s = 0.0  # waits for the step's data in the current window
        self._warmup_s = 0.0  # compilation's first steps in the current window
        self.data_s: float | None = None
        self._steps: list[list[Any]] = []  # [step, loss, lr, grad_norm, tokens] since the last
        self._window_tokens = 0  # trained tokens of the steps noted in the current window
        self.tokens_total = 0  # of every step noted
        self._step_period_s: float | None = None
        self.fixed: dict[str, Any] = {}  # sent with every snapshot (fsdp_units, ...)

    def add_step(self, step: int, loss: float, lr: float, grad_norm: float | None,
                 tokens: int | None = None) -> None:
        """Note one step's figures, sent with the next snapshot. `tokens`: those it trained
        on (masked data's trained targets; default every token of the step)."""
        tokens = self.tokens_per_step if tokens is None else tokens
        self._steps.append([step, loss, lr, grad_norm, tokens])
        self._window_tokens += tokens
        self.tokens_total += tokens

    def saved(self, seconds: float) -> None:
        """A checkpoint save took `seconds` of the current window: tokens/s counts it (it is
        what the job gets), the step time does not (it is what the planner predicts)."""
        self._saving_s += seconds

    def waited_for_data(self, seconds: float) -> None:
        """The step waited `seconds` for its data: tokens/s counts it, the step time does not
        (it is reported apart, as data_s a step)."""
        self._data_s += seconds

    def warmed_up(self, seconds: float) -> None:
        """Compilation took `seconds` of the first step: reported apart (warmup_s) and left
        out of tokens/s (so of the ETA) and of the step time."""
        self._warmup_s += seconds
        self.fixed["warmup_s"] = self.fixed.get("warmup_s", 0.0) + seconds

    def validated(self, step: int, loss: float, seconds: float) -> None:
        """The validation loss at `step`, measured in `seconds`: reported with every report
        from now on (val_loss, val_step, eval_s) and left out of the step time."""
        self.fixed.update(val_loss=loss, val_step=step, eval_s=seconds)
        self._saving_s += seconds

    def record(self, step: int, loss: float, last: bool = False) -> bool:
        """Note that `step` steps are done with `loss`; True when a publication is due:
        every interval, and at the run's `last` step (the job's end, a stop, a cut), whose
        steps would otherwise ride a publication that never comes."""
        self.step, self.loss = step, loss
        if self.first_loss is None:
            self.first_loss = loss
        now = self.clock()
        due = now - self._last_publish_at >= self.interval_s or step >= self.total_steps \
            or last
        if due:
            window_t, window_step = self._window_start
            span = now - window_t - self._warmup_s
            if step > window_step and span > 0:
                steps = step - window_step
                self.tokens_per_s = (self._window_tokens or steps * self.tokens_per_step) / span
                self._step_period_s = span / steps
                self.step_s = max(0.0, span - self._saving_s - self._data_s) / steps
                self.data_s = self._data_s / steps
            self._window_start, self._saving_s = (now, step), 0.0
            self._data_s = self._warmup_s = 0.0
            self._window_tokens = 0
            self._last_publish_at = now
        return due

    def snapshot(self) -> dict[str, Any]:
        remaining = self.total_steps - self.step
        eta = remaining * self._step_period_s if self._step_period_s is not None else None
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": self.loss,
            "first_loss": self.first_loss,
            "tokens_per_s": self.tokens_per_s,
            "step_s": self.step_s,
            "data_s": self.data_s,
            "elapsed_s": self.clock() - self.started_at,
            "eta_s": eta,
            **self.fixed,
            "steps": self._take_steps(),
        }

    def _take_steps(self) -> list[list[Any]]:
        steps, self._steps = self._steps, []
        return steps
