"""Checkpoints: a small manager over torch distributed checkpoint (DCP), kept in a store
(raytrain.cloud.object_store: a folder, or an S3-compatible bucket).

Each checkpoint is `step_000000120/` under the job's checkpoint root, holding the DCP shards
of model and optimizer (`__<r>_<n>.distcp`, `.metadata`), one `rank_<r>.pt` per rank (its RNG
state), `meta.json` (step, data position, first loss, layout), one `.done/rank_<r>` per rank
once that rank's files are stored and, last, a `COMMITTED` marker that rank 0 writes when
every rank's `.done` is there. The latest checkpoint is the highest step with a marker; resume
and retention read only those, so an upload that fails or is killed half-way leaves nothing
that can be loaded, and the next save starts that step afresh.

Saving does not stop training for the write. `save` copies the state to host memory (DCP's
`async_save` with its default stager: the only stall), and a background thread writes the
shards (DCP, on a process group of its own, so its collectives never mix with training's),
uploads them, and commits. At most one save is in flight: a periodic save while the last one
is still uploading is skipped (training goes on; `skipped` counts them), and `flush()` (a
notice, the end of training) waits for the one in flight. An upload that fails is retried with
back-off until it goes through; until then the last durable checkpoint ages, which the service
shows. `on_durable(step, ref, stall_s, durable_s)` is called on rank 0 when a checkpoint is
committed: the stall is what the capacity engine prices checkpoints with.

On a folder store the shards are written in place (no copy). On a bucket they are written to a
staging folder on local disk and uploaded from there; loading downloads a checkpoint's objects
to a local cache first. Why not Ray Train's own checkpoint registration: a worker that dies
right after writing can leave a checkpoint written but never registered. Here the marker is the
registration, on the same storage as the data.

DCP makes the files layout-independent: a checkpoint saved under one parallel layout loads
under another. A rank may hold several model parts (pipeline stages), each with its own
optimizer. State is keyed by the parameter names of the whole model, optimizer state flattened
per parameter (`flatten_optimizer_state_dict`), so parts, shards and replicas of any layout
address the same entries and DCP reshards between them.

    manager = CheckpointManager("s3://bucket/jobs/ab12/checkpoints", rank=0, world_size=1)
    manager.save(step=50, parts=[model], optimizers=[opt], meta={"samples_seen": 800})
    manager.flush()                     # the one in flight is committed
    meta = manager.load(manager.latest(), [model], [opt])
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from raytrain.cloud.object_store import (
    COMMIT_MARKER,
    LocalStore,
    Store,
    checkpoint_committed,
    is_remote,
    open_store,
)
from raytrain.errors import StoreError, TrainingError
from raytrain.train.bucket_reader import BucketReader

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{9})$")
DONE_DIR = ".done"
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0
FLUSH_TIMEOUT_S = 1800.0  # the end of training waits this long for a store that is down
Durable = Callable[[int, str, float, float], None]  # step, ref, stall_s, durable_s


def step_name(step: int) -> str:
    return f"step_{step:09d}"


def latest_checkpoint(root: Path) -> Path | None:
    """The committed checkpoint with the highest step under a local `root`, or None."""
    ref = committed_steps(LocalStore(root))
    return root / step_name(ref[-1]) if ref else None


def committed(ref: str) -> bool:
    """Whether checkpoint `ref` (a folder, or s3://.../step_N) has its commit marker."""
    return checkpoint_committed(str(ref))[0]


def committed_steps(store: Store) -> list[int]:
    """Steps of the committed checkpoints in `store` (a job's checkpoint root), ascending."""
    steps = set()
    for key in store.keys(""):
        name, _, rest = key.partition("/")
        match = _STEP_DIR.match(name)
        if match and rest == COMMIT_MARKER:
            steps.add(int(match.group(1)))
    return sorted(steps)


def read_meta(checkpoint: Path | str) -> dict[str, Any]:
    store, name = _locate(str(checkpoint))
    data = store.get_bytes(f"{name}/meta.json")
    if data is None:
        raise FileNotFoundError(f"{checkpoint} has no meta.json: not a committed checkpoint")
    meta: dict[str, Any] = json.loads(data)
    return meta


def _locate(ref: str) -> tuple[Store, str]:
    """The store holding checkpoint `ref` (its parent) and the checkpoint's name in it."""
    parent, _, name = ref.rstrip("/").rpartition("/")
    return open_store(parent or "."), name


def _staging_root(uri: str) -> Path:
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "raytrain-staging" / digest


@dataclass
class _InFlight:
    step: int
    thread: threading.Thread
    error: BaseException | None = None


class CheckpointManager:
    def __init__(self, root: Path | str, rank: int, keep: int = 2, world_size: int = 1,
                 asynchronous: bool = True, on_durable: Durable | None = None,
                 retry_first_s: float = RETRY_FIRST_S) -> None:
        self.uri = str(root)
        self.store = open_store(self.uri)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.asynchronous = asynchronous
        self.on_durable = on_durable
        self.retry_first_s = retry_first_s
        self.skipped = 0  # periodic saves skipped because the last upload was still going
        self.bytes_read = 0  # from a bucket, by the last load
        self._remote = is_remote(self.uri)
        self._staging = _staging_root(self.uri) if self._remote else Path(self.uri)
        self._inflight: _InFlight | None = None
        self._pg: Any = None  # DCP's background save's collectives
        self._votes: Any = None  # this manager's own, on the training thread
        if world_size > 1 and dist.is_available() and dist.is_initialized():
            # Two gloo groups (every rank builds the manager at the same point): DCP's
            # background save runs collectives on its thread while the training thread
            # votes on the next save; sharing a group, the two threads' calls could pair
            # across ranks in different orders and hang.
            self._votes = dist.new_group(backend="gloo")
            if asynchronous:
                self._pg = dist.new_group(backend="gloo")

    def __str__(self) -> str:
        return self.uri

    def ref(self, step: int) -> str:
        """How a checkpoint is named in statuses and `training.resume_from`."""
        return f"{self.uri.rstrip('/')}/{step_name(step)}"

    def latest(self) -> str | None:
        steps = committed_steps(self.store)
        return self.ref(steps[-1]) if steps else None

    @property
    def busy(self) -> bool:
        return self._inflight is not None and self._inflight.thread.is_alive()

    def save(
        self,
        step: int,
        parts: list[nn.Module],
        optimizers: list[torch.optim.Optimizer],
        meta: dict[str, Any],
        wait: bool = False,
    ) -> float | None:
        """Start saving the state at `step`; the seconds training stalled, or None when a
        save still in flight made this one be skipped (not when `wait`). Every rank calls it
        at the same step. `wait`: a notice or the end: wait for the one in flight, save, and
        return once this one is committed."""
        started = time.perf_counter()
        busy = self._any_rank(self.busy)
        if busy and not wait:
            self.skipped += 1
            if self.rank == 0:
                logger.warning("checkpoint at step %d skipped: the one at step %d is still "
                               "being stored", step, self._inflight.step if self._inflight
                               else -1)
            return None
        self._join()
        name = step_name(step)
        folder = self._staging / name
        if self.rank == 0:
            if folder.exists():  # a half-written attempt at this step from a crashed run
                shutil.rmtree(folder)
            self.store.delete_prefix(f"{name}/")  # and whatever of it was uploaded
        self._barrier()
        folder.mkdir(parents=True, exist_ok=True)  # on every node
        model_state, optim_state, _ = _state(parts, optimizers)
        state = {"model": model_state, "optim": optim_state}
        torch.save({"rng": torch.get_rng_state()}, folder / f"rank_{self.rank}.pt")
        if self.asynchronous:
            pending = dcp_async_save(state, checkpoint_id=str(folder), process_group=self._pg)
            stall_s = time.perf_counter() - started
            thread = threading.Thread(target=self._finish, name=f"checkpoint-{step}",
                                      args=(step, folder, meta, pending, started, stall_s),
                                      daemon=True)
            self._inflight = _InFlight(step, thread)
            thread.start()
            if wait:
                self._join()
            return stall_s
        dcp_save(state, checkpoint_id=str(folder))
        self._finish(step, folder, meta, None, started, None)
        return time.perf_counter() - started

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait for the save in flight to be committed (a notice, the end of training)."""
        self._join(timeout_s)

    def _any_rank(self, flag: bool) -> bool:
        """Whether any rank says so: every rank must take the same decision to skip."""
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return flag
        value = torch.tensor([float(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._votes)
        return bool(value.item() > 0)

    def _barrier(self) -> None:
        if self._votes is not None:
            dist.barrier(group=self._votes)

    def _join(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        inflight.thread.join(timeout_s)
        if inflight.thread.is_alive():
            raise TrainingError(f"the checkpoint at step {inflight.step} could not be stored "
                                f"in {timeout_s:.0f} s ({self.uri}); the store is down or too "
                                "slow. To fix: check the store, then resume the job")
        if inflight.error is not None:
            raise TrainingError(f"the checkpoint at step {inflight.step} failed: "
                                f"{inflight.error}") from inflight.error

    def _finish(self, step: int, folder: Path, meta: dict[str, Any], pending: Any,
                started: float, stall_s: float | None) -> None:
        """Write (if asynchronous), upload this rank's files, and on rank 0 commit."""
        try:
            if pending is not None:
                pending.result()  # DCP's writes to the staging folder
            name = step_name(step)
            self._retry(f"storing {name}", lambda: self._upload(folder, name))
            if self.rank == 0:
                self._retry(f"committing {name}", lambda: self._commit(name, step, meta))
                durable_s = time.perf_counter() - started
                self._retry("removing older checkpoints", lambda: self._prune(step))
                if self._remote:
                    shutil.rmtree(folder, ignore_errors=True)
                if self.on_durable is not None:
                    self.on_durable(step, self.ref(step),
                                    durable_s if stall_s is None else stall_s, durable_s)
            elif self._remote:
                shutil.rmtree(folder, ignore_errors=True)
        except BaseException as exc:  # raised to the training loop at flush
            if self._inflight is not None and self._inflight.step == step:
                self._inflight.error = exc
            if pending is None:
                raise

    def _retry(self, what: str, call: Callable[[], None]) -> None:
        wait = self.retry_first_s
        while True:
            try:
                call()
                return
            except StoreError as exc:
                logger.warning("%s: %s; trying again in %.0f s", what, exc, wait)
                time.sleep(wait)
                wait = min(RETRY_MAX_S, wait * 2)

    def _mine(self, path: Path) -> bool:
        name = path.name
        if name == f"rank_{self.rank}.pt" or name.startswith(f"__{self.rank}_"):
            return True
        return self.rank == 0 and name == ".metadata"

    def _upload(self, folder: Path, name: str) -> None:
        if self._remote:
            for path in sorted(folder.iterdir()):
                if path.is_file() and self._mine(path):
                    self.store.put_file(path, f"{name}/{path.name}")
        self.store.put_bytes(f"{name}/{DONE_DIR}/rank_{self.rank}", b"")

    def _commit(self, name: str, step: int, meta: dict[str, Any]) -> None:
        done = f"{name}/{DONE_DIR}/"
        while sum(1 for _ in self.store.keys(done)) < self.world_size:
            time.sleep(0.1)  # the other ranks' uploads
        self.store.put_bytes(f"{name}/meta.json", json.dumps({"step": step, **meta}).encode())
        self.store.put_bytes(f"{name}/{COMMIT_MARKER}", b"")

    def _prune(self, newest: int) -> None:
        """Keep the `keep` newest committed checkpoints; drop older ones and any uncommitted
        attempt below the newest."""
        committed = [s for s in committed_steps(self.store) if s <= newest]
        kept = set(committed[-self.keep:]) if self.keep > 0 else {newest}
        names = {key.partition("/")[0] for key in self.store.keys("")}
        for name in sorted(names):
            match = _STEP_DIR.match(name)
            if match and int(match.group(1)) < newest and int(match.group(1)) not in kept:
                self.store.delete_prefix(f"{name}/")

    def load(
        self, ref: Path | str, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, Any]:
        """Load checkpoint `ref` (from `latest()`, or any committed checkpoint's ref). From a
        bucket each rank fetches only the ranges of what it holds (train.bucket_reader);
        `bytes_read` says how much."""
        model_state, optim_state, keys = _state(parts, optimizers)
        state = {"model": model_state, "optim": optim_state}
        if is_remote(str(ref)):
            store, name = _locate(str(ref))
            if store.get_bytes(f"{name}/{COMMIT_MARKER}") is None:
                raise TrainingError(f"{ref} is not a committed checkpoint. To fix: resume from "
                                    "a step that `raytrain status` lists as checkpointed")
            reader = BucketReader(store, name)
            dcp_load(state, storage_reader=reader)
            rank_state = store.get_bytes(f"{name}/rank_{self.rank}.pt")
            meta_bytes = store.get_bytes(f"{name}/meta.json") or b"{}"
            self.bytes_read = reader.bytes_read + len(rank_state or b"") + len(meta_bytes)
        else:
            folder = Path(ref)
            dcp_load(state, checkpoint_id=str(folder))
            rank_file = folder / f"rank_{self.rank}.pt"
            rank_state = rank_file.read_bytes() if rank_file.is_file() else None
            meta_bytes = (folder / "meta.json").read_bytes()
        for part, optimizer, (model_keys, optim_keys) in zip(parts, optimizers, keys):
            set_state_dict(
                part,
                optimizer,
                model_state_dict={k: state["model"][k] for k in model_keys},
                optim_state_dict={k: state["optim"][k] for k in optim_keys},
                options=_OPTIONS,
            )
        if rank_state is not None:  # absent when resuming on more ranks than saved
            torch.set_rng_state(torch.load(io.BytesIO(rank_state), weights_only=True)["rng"])
        meta: dict[str, Any] = json.loads(meta_bytes)
        return meta


_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(
    parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[list[str], list[str]]]]:
    """Model and optimizer state of all parts, merged by name, and which names each part owns.

    Reading leaves every optimizer as it was. torch fills an optimizer that has not stepped
    yet by stepping it once with a learning rate of 0 (get_state_dict's _init_optim_state),
    and AdamW counts that step: its next real step would correct its moments' bias as for
    step 2. So a fresh optimizer is put back to fresh, and its state reads as a fresh one's
    (step 0, zero moments: what AdamW does with it is what it does with no state). A group
    asked for its state before its first step (torchft's first quorum) trained wrong."""
    model_state: dict[str, Any] = {}
    optim_state: dict[str, Any] = {}
    keys = []
    for part, optimizer in zip(parts, optimizers, strict=True):
        fresh = not optimizer.state
        part_model, part_optim = get_state_dict(part, optimizer, options=_OPTIONS)
        if fresh:
            optimizer.state.clear()
            part_optim = {k: torch.zeros_like(v)  # type: ignore[arg-type,misc]
                          if k.endswith(".step") else v for k, v in part_optim.items()}
        model_state.update(part_model)
        optim_state.update(part_optim)
        keys.append((list(part_model), list(part_optim)))
    return model_state, optim_state, keys
