"""The client-only install (the getting-started page's wheel, or `pip install .`) is the
client and the command line: submitting, watching, planning
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
        assert "pip install '.[server]'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_the_readmes_client_wheel_line_builds_a_wheel_that_runs_without_the_server(
        tmp_path: Path) -> None:
    """The getting-started page's line, run as written (python3 -> this Python; the build
    backend this venv's, so that nothing is fetched) in a copy of the clone: the wheel
    builds, installs, and its command line runs with no server package importable."""
    import shutil

    line = next(text for text in (ROOT / "docs" / "index.md").read_text().splitlines()
                if text.startswith("python3 -m pip wheel"))
    build, install = (part.strip().replace("python3", sys.executable, 1)
                      for part in line.split("&&"))
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis"))
    # With this venv's setuptools as the build backend: the test reaches no package index.
    built = subprocess.run(f"{build} --no-build-isolation", shell=True, cwd=clone,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    site = tmp_path / "site"  # its dependencies are this venv's: the wheel alone goes in
    done = subprocess.run(f"{install} --no-deps --target {site}", shell=True, cwd=clone,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{BLOCKER}",
           "RAYTRAIN_STATE_DIR": "/nonexistent"}
    where = subprocess.run([sys.executable, "-c", "import raytrain; print(raytrain.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert where.stdout.startswith(str(site)), where.stderr
    plan = subprocess.run([sys.executable, "-m", "raytrain.cli", "plan", "--json",
                           str(ROOT / "examples" / "demo.yaml")], env=env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert plan.returncode == 0, plan.stderr
