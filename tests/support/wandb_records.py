"""The records of a W&B run file (`run-ID.wandb`), read as W&B writes them: a 7-byte header
(":W&B", magic 0xBEE1, version 0), then LevelDB's log format (32 KiB blocks; each chunk a
CRC32-C, a 2-byte length and a type: full, first, middle, last) around serialized
`wandb_internal_pb2.Record` messages. wandb 0.31's Python package no longer ships a reader
(its Go core reads them), so the tests read them here."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    at, pending = HEADER, b""
    while at + HEADER <= len(data):
        left = BLOCK - at % BLOCK
        if left < HEADER:  # the block's tail is padding
            at += left
            continue
        _, length, kind = struct.unpack("<IHB", data[at:at + HEADER])
        chunk = data[at + HEADER:at + HEADER + length]
        at += HEADER + length
        if kind == 0 and length == 0:  # zeroed padding
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def history(path: Path, step_key: str = "raytrain/step") -> dict[int, dict[str, Any]]:
    """Each logged row's items, by the job's step (`step_key`, the run's step metric); rows
    logged at one step merged."""
    out: dict[int, dict[str, Any]] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in record.history.item}
            out.setdefault(int(items[step_key]), {}).update(items)
    return out
