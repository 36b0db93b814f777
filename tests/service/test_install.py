"""A plain (non-editable) install carries its own data: the offers snapshot, the named
policies, the spot traces, the demo's job spec and the dashboard's files. Run from a
directory far from the checkout, it lists the offers, ranks a job under every shipped
policy, and replays a trace.
(`raytrain demo` from such an install was run by hand; it starts Ray, which this test does
not afford.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from raytrain.testing.jobs import gpt_1b_job

ROOT = Path(__file__).resolve().parents[2]


def test_a_plain_install_finds_its_data_from_any_directory(tmp_path: Path) -> None:
    site, elsewhere, source = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "source"
    elsewhere.mkdir()
    # a copy of the checkout, so the build leaves nothing in it
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(source)],
                   check=True, cwd=elsewhere, timeout=300)
    assert not (site / "raytrain" / "__editable__").exists()
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(tmp_path)}

    def raytrain(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "raytrain.cli", *args], cwd=elsewhere,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    where = subprocess.run([sys.executable, "-c", "import raytrain; print(raytrain.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(site)), "the test must run the installed copy"
    offers = json.loads(raytrain("offers", "--json"))
    assert offers["offers"] and offers["source"] == "snapshot"
    assert (site / "raytrain" / "examples" / "demo.yaml").is_file()  # what `demo` trains
    web = site / "raytrain" / "serve" / "http" / "web"  # the dashboard, and /docs' assets
    for shipped in ("index.html", "app.js", "style.css", "vendor/uPlot.iife.min.js",
                    "vendor/uPlot.LICENSE", "vendor/swagger-ui-bundle.js",
                    "vendor/redoc.standalone.js", "vendor/js-yaml.min.js"):
        assert (web / shipped).is_file(), shipped
    job = elsewhere / "job.json"
    job.write_text(json.dumps(gpt_1b_job("h100-sxm", capacity={"deadline_hours": 48})))
    policies = sorted(p.stem for p in (site / "raytrain" / "catalog" / "policies").glob("*.yaml"))
    assert {"cost-first", "deadline-aware", "on-demand-only", "spot-only"} <= set(policies)
    for policy in policies:
        ranked = json.loads(raytrain("offers", str(job), "--policy", policy, "--json"))
        assert ranked["policy"] == policy and ranked["ranking"], policy
    # the shipped default trace, replayed through the service once, small (the figures are
    # benchmarks/spot_simulation.py's)
    replay = json.loads(raytrain("simulate", "--json", "--starts", "1", "--nodes", "2",
                                 "--work-hours", "1", "--deadline-hours", "3"))
    assert replay, "the simulator replayed nothing"


def test_a_script_beside_the_clone_imports_the_installed_package(tmp_path: Path) -> None:
    """Run from the folder above a clone, where the clone's folder (`raytrain/`, no
    __init__.py) is a namespace package on sys.path first: the README's editable install is
    by path (editable_mode=compat), so the package it installed is still the one imported.
    With setuptools' default import hook for a flat layout the clone's folder shadowed it
    (ImportError: cannot import name 'Client' from 'raytrain' (unknown location))."""
    clone = tmp_path / "raytrain"  # what `git clone .../raytrain` leaves beside the script
    clone.mkdir()
    (clone / "README.md").write_text("a clone\n")
    script = tmp_path / "submit.py"
    script.write_text("import raytrain\nfrom raytrain import Client\nprint(raytrain.__file__)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "raytrain" / "__init__.py")
