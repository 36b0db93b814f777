"""A job file's relative paths: made absolute against the folder the CLI runs in for a
service on this machine, refused naming each field for a service elsewhere (which would
read them against its own folder); URIs, absolute and home paths pass as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain.cli.local_paths import absolute_paths, on_this_machine
from raytrain.errors import SpecError
from raytrain.spec.local_paths import relative_hint

DOCUMENT = {"data": {"kind": "token_file", "path": "data/chat-tok",
                     "validation": {"path": "val/tok"}},
            "model": {"kind": "hf", "hf": {"path": "models/llama"}},
            "training": {"resume_from": "s3://bucket/job/step_1"}}


def test_relative_paths_become_absolute_for_a_service_on_this_machine(tmp_path: Path) -> None:
    for url in ("http://127.0.0.1:8000", "http://localhost:9000", "http://[::1]:8000"):
        assert on_this_machine(url)
        made = absolute_paths(DOCUMENT, url, tmp_path)
        assert made["data"]["path"] == str(tmp_path / "data" / "chat-tok")
        assert made["data"]["validation"]["path"] == str(tmp_path / "val" / "tok")
        assert made["model"]["hf"]["path"] == str(tmp_path / "models" / "llama")
        assert made["training"]["resume_from"] == "s3://bucket/job/step_1"
    assert DOCUMENT["data"]["path"] == "data/chat-tok"  # the caller's document is its own
    fixed = {"data": {"path": "/abs/tok"}, "model": {"hf": {"path": "~/models/x"}}}
    assert absolute_paths(fixed, "http://10.0.0.5:8000", tmp_path) == fixed


def test_a_relative_path_for_a_service_elsewhere_is_refused_naming_the_field(
        tmp_path: Path) -> None:
    assert not on_this_machine("https://raytrain.example.com")
    with pytest.raises(SpecError) as refused:
        absolute_paths(DOCUMENT, "https://raytrain.example.com", tmp_path)
    assert [e.path for e in refused.value.errors] == [
        "data.path", "data.validation.path", "model.hf.path"]
    assert "To fix: give the absolute path" in str(refused.value)
    assert "read against the folder the service runs in" in relative_hint("data/tok")
    assert relative_hint("/data/tok") == relative_hint("s3://b/k") == ""
