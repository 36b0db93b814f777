"""`pip install raytrain` is the client and the command line: submitting, watching, planning
and ranking offers work without torch, Ray or boto3, and the commands that run the service or
training say which extra to install instead of a traceback. A Python that cannot import the
`server` extra's packages (tests/clientonly/sitecustomize.py) stands in for that install."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from raytrain.cli.parser import SERVER_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = ROOT / "tests" / "clientonly"


def _client_only(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "raytrain.cli",
                                                        *args]
    env = {**os.environ, "PYTHONPATH": str(BLOCKER), "RAYTRAIN_STATE_DIR": "/nonexistent"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_the_base_install_names_no_server_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower()
            for d in project["dependencies"]}
    assert base == {"pydantic", "httpx", "pyyaml", "rich"}
    server = " ".join(project["optional-dependencies"]["server"])
    for package in ("torch", "ray[train,serve]", "torchft", "boto3"):
        assert package in server
    blocked = (BLOCKER / "sitecustomize.py").read_text()
    assert all(f'"{name}"' in blocked for name in SERVER_PACKAGES)


def test_the_client_and_the_cli_work_without_the_server_packages() -> None:
    """Without the blocker each check passes too; with a server package imported at the top
    of raytrain.client or raytrain.cli, every one fails."""
    proof = _client_only(code="import torch")
    assert proof.returncode != 0 and "No module named 'torch'" in proof.stderr
    library = _client_only(code=(
        "from raytrain import Client, JobState, load_job_spec\n"
        "spec = load_job_spec('examples/demo.yaml')\n"
        "print(spec.name, JobState.SUCCEEDED)"))
    assert library.returncode == 0, library.stderr
    assert library.stdout.split() == ["demo", "SUCCEEDED"]
    assert _client_only("--help").returncode == 0
    unreachable = _client_only("list", "--server", "http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
    plan = _client_only("plan", "examples/demo.yaml")
    assert plan.returncode == 0 and "best:" in plan.stdout, plan.stderr
    offers = _client_only("offers", "--json")
    assert offers.returncode == 0 and '"offers"' in offers.stdout, offers.stderr


def test_server_commands_name_the_extra_to_install() -> None:
    for command in (["serve"], ["demo"], ["simulate", "--starts", "1"]):
        done = _client_only(*command)
        assert done.returncode == 1, (command, done.stderr)
        assert "pip install 'raytrain[server]'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
