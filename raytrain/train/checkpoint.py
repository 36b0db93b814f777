"""Checkpoints: a small manager over torch distributed checkpoint (DCP).

Each checkpoint is a directory `step_000000120/` under the job's checkpoint root holding the
DCP shards of model and optimizer, one `rank_<r>.pt` per rank (its RNG state), `meta.json`
(step, data position, first loss, layout) and, last, a `COMMITTED` marker written by rank 0
after every rank finished. The latest checkpoint is the highest step with a marker.

Why not Ray Train's own checkpoint registration: a worker that dies right after writing can
leave a checkpoint written but never registered, and the run resumes from the one before. Here
the marker is the registration, written on the same storage as the data, so a checkpoint is
either complete and found, or ignored. DCP makes the files layout-independent: a checkpoint
saved under one parallel layout loads under another.

A rank may hold several model parts (pipeline stages), each with its own optimizer. State is
keyed by the parameter names of the whole model, optimizer state flattened per parameter
(`flatten_optimizer_state_dict`), so parts, shards and replicas of any layout address the
same entries and DCP reshards between them.

    manager = CheckpointManager(root, rank=0)
    manager.save(step=50, parts=[model], optimizers=[opt], meta={"samples_seen": 800})
    meta = manager.load(manager.latest(), [model], [opt])
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{9})$")
COMMIT_MARKER = "COMMITTED"


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def latest_checkpoint(root: Path) -> Path | None:
    """The committed checkpoint with the highest step under `root`, or None."""
    if not root.is_dir():
        return None
    committed = [
        child
        for child in root.iterdir()
        if _STEP_DIR.match(child.name) and (child / COMMIT_MARKER).is_file()
    ]
    return max(committed, key=lambda p: p.name, default=None)


def read_meta(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "meta.json").read_text())


class CheckpointManager:
    def __init__(self, root: Path, rank: int, keep: int = 2) -> None:
        self.root = root
        self.rank = rank
        self.keep = keep

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(
        self,
        step: int,
        parts: list[nn.Module],
        optimizers: list[torch.optim.Optimizer],
        meta: dict[str, Any],
    ) -> Path:
        path = self.root / f"step_{step:09d}"
        if self.rank == 0:
            if path.exists():  # a half-written attempt at this step from a crashed run
                shutil.rmtree(path)
            path.mkdir(parents=True)
        _barrier()
        model_state, optim_state, _ = _state(parts, optimizers)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
        torch.save({"rng": torch.get_rng_state()}, path / f"rank_{self.rank}.pt")
        _barrier()
        if self.rank == 0:
            _write_atomically(path / "meta.json", json.dumps({"step": step, **meta}))
            _write_atomically(path / COMMIT_MARKER, "")
            self._prune(keep_latest=path)
        return path

    def load(
        self, path: Path, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, Any]:
        model_state, optim_state, keys = _state(parts, optimizers)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(path))
        for part, optimizer, (model_keys, optim_keys) in zip(parts, optimizers, keys):
            set_state_dict(
                part,
                optimizer,
                model_state_dict={k: state["model"][k] for k in model_keys},
                optim_state_dict={k: state["optim"][k] for k in optim_keys},
                options=_OPTIONS,
            )
        rank_file = path / f"rank_{self.rank}.pt"
        if rank_file.is_file():  # absent when resuming on more ranks than saved
            torch.set_rng_state(torch.load(rank_file, weights_only=True)["rng"])
        return read_meta(path)

    def _prune(self, keep_latest: Path) -> None:
        older = sorted(
            p.name
            for p in self.root.iterdir()
            if _STEP_DIR.match(p.name) and p.name < keep_latest.name
        )
        for name in older[: max(0, len(older) - (self.keep - 1))]:
            shutil.rmtree(self.root / name, ignore_errors=True)


_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(
    parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[list[str], list[str]]]]:
    """Model and optimizer state of all parts, merged by name, and which names each part owns."""
    model_state: dict[str, Any] = {}
    optim_state: dict[str, Any] = {}
    keys = []
    for part, optimizer in zip(parts, optimizers, strict=True):
        part_model, part_optim = get_state_dict(part, optimizer, options=_OPTIONS)
        model_state.update(part_model)
        optim_state.update(part_optim)
        keys.append((list(part_model), list(part_optim)))
    return model_state, optim_state, keys


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
