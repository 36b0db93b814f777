"""The paths on a node's disk that a job spec names (data, validation data, a model folder,
a checkpoint to resume from), and what a relative one means: the service reads a job's paths
on its own nodes, so a relative path there is relative to the folder the service was started
in, which a user rarely knows. The service's refusals of a path that is not there say so
(`relative_hint`); the CLI makes such paths absolute before it sends a job
(raytrain.cli.local_paths).

    relative_hint("data/tok")  # " (a relative path is read against the folder ...)"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# (where in the document, as a path of keys)
PATH_FIELDS: tuple[tuple[str, ...], ...] = (
    ("data", "path"), ("data", "validation", "path"), ("model", "hf", "path"),
    ("training", "resume_from"))


def is_relative(value: Any) -> bool:
    """A local path (no scheme://) that is neither absolute nor from the home folder (~)."""
    return isinstance(value, str) and bool(value) and "://" not in value and \
        not value.startswith("~") and not Path(value).is_absolute()


def relative_hint(value: str) -> str:
    """For a refusal of a path the service's node cannot read: how it read a relative one
    ('' for an absolute path or a URI)."""
    if not is_relative(value):
        return ""
    return (f" (a relative path is read against the folder the service runs in, "
            f"{os.getcwd()}: give an absolute path)")
