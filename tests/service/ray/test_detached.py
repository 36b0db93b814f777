"""`raytrain serve --detach` leaves a working service behind, and `raytrain stop` stops what
it started and nothing else (the session's own Ray cluster, if running, is untouched)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from raytrain.api_tokens import read_tokens
from raytrain.testing.ray_service import free_port

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

BIN = Path(sys.executable).parent


def _beside_a_clone(folder: Path) -> Path:
    """A folder as a user stands in: the parent of a clone (a `raytrain/` folder that is not
    the installed package) beside a package folder of their own (`mylab/`); importing either
    from there fails loudly."""
    for name in ("raytrain", "mylab"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the {name}/ folder in the working directory was imported')\n")
    return folder


def test_serve_detach_keeps_running_until_raytrain_stop(tmp_path: Path) -> None:
    """Started from beside a clone (whose `raytrain/` folder Ray's workers imported instead
    of the installed package, so the service never deployed), on loopback only."""
    state_dir, port = tmp_path / "state", free_port()
    here = _beside_a_clone(tmp_path / "work")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    others = {p.pid for p in psutil.process_iter(["cmdline"])
              if "raylet" in " ".join(p.info.get("cmdline") or [])}
    started = subprocess.run(
        [str(BIN / "raytrain"), "serve", "--detach", f"--port={port}",
         f"--state-dir={state_dir}", "--allow-import", "mylab"],
        env=env, capture_output=True, text=True, timeout=240, cwd=here)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert "raytrain stop" in started.stderr
        # The command has exited; the service it started still answers.
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        token = read_tokens(state_dir)["operator"]  # written at the first start, owner-only
        assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/v1/jobs", timeout=10, headers=auth).json() == []
        # The job manager imports what is installed too: no mylab is, the folder is not it.
        refused = httpx.post(f"{url}/v1/jobs", timeout=30, headers=auth, json={
            "model": {"kind": "import", "factory": "mylab.models:build"},
            "data": {"kind": "import", "factory": "mylab.data:build"}})
        assert refused.status_code == 422, refused.text
        assert "cannot import 'mylab.models'" in refused.text
        assert "folder in the working directory" not in refused.text
        # Ray took the loopback address it was given, not the machine's outward one.
        head_log = re.sub(r"\x1b\[[0-9;]*m", "", (state_dir / "ray-head.log").read_text())
        assert "Local node IP: 127.0.0.1" in head_log
        assert "tokens.json" in started.stderr
        record = json.loads((state_dir / "service.json").read_text())
        assert psutil.pid_exists(record["head_pid"])
        # Ray's session folder (its logs) is reached from the state dir, not /tmp/ray: a pytest
        # path is too long for Ray's sockets, so `ray` there links to a short folder.
        session = Path(record["temp_dir"])
        assert session.name.startswith("session_2") and (session / "logs").is_dir()
        assert session.parent == (state_dir / "ray").resolve()
        again = subprocess.run(
            [str(BIN / "raytrain"), "serve", "--detach", f"--port={free_port()}",
             f"--state-dir={state_dir}"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "raytrain stop" in again.stderr
    finally:
        stopped = subprocess.run(
            [str(BIN / "raytrain"), "stop", f"--state-dir={state_dir}"],
            env=env, capture_output=True, text=True, timeout=180)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=5)
    assert not psutil.pid_exists(record["head_pid"]) or \
        psutil.Process(record["head_pid"]).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in psutil.process_iter(["cmdline"])
                if record["temp_dir"] in " ".join(p.info.get("cmdline") or [])]
    assert not session.exists()  # its session folder went with it
    assert others <= {p.pid for p in psutil.process_iter(["cmdline"])
                      if "raylet" in " ".join(p.info.get("cmdline") or [])}
    nothing = subprocess.run([str(BIN / "raytrain"), "stop", f"--state-dir={state_dir}"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 1 and "nothing to stop" in nothing.stderr
