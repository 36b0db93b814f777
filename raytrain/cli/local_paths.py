"""A job file's relative paths, before the CLI sends it: made absolute against the folder
the CLI runs in when the service is on this machine (loopback), refused naming each field
otherwise (the service would read them against its own folder: raytrain.spec.local_paths).

    document = absolute_paths(document, "http://127.0.0.1:8000", Path.cwd())
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from raytrain.api_tokens import is_loopback
from raytrain.errors import FieldError, SpecError
from raytrain.spec.local_paths import PATH_FIELDS, is_relative


def on_this_machine(server_url: str) -> bool:
    """Whether a service URL is on this machine (every address its host stands for is a
    loopback one)."""
    return is_loopback(urlparse(server_url).hostname or "")


def absolute_paths(document: Any, server_url: str, cwd: Path) -> Any:
    """`document` with each relative path of PATH_FIELDS made absolute against `cwd`, for
    a service on this machine; SpecError naming each such field for a service elsewhere.
    A document that is not a mapping is returned as it is (its own errors come later)."""
    if not isinstance(document, dict):
        return document
    found = []
    for loc in PATH_FIELDS:
        parent: Any = document
        for key in loc[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and is_relative(parent.get(loc[-1])):
            found.append((loc, parent[loc[-1]]))
    if not found:
        return document
    if not on_this_machine(server_url):
        raise SpecError([FieldError(loc, (
            f"{value} is a relative path, and the service at {server_url} runs on another "
            "machine, which would read it against its own folder. To fix: give the absolute "
            "path on storage the service's nodes mount, or an s3:// URI"))
            for loc, value in found])
    document = copy.deepcopy(document)
    for loc, value in found:
        parent = document
        for key in loc[:-1]:
            parent = parent[key]
        parent[loc[-1]] = str((cwd / value).resolve())
    return document
