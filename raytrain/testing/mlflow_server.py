"""A real MLflow tracking server on 127.0.0.1 (the `mlflow server` of the package), with its
runs in a SQLite file and its artifacts in a folder, for the tracking tests: started, stopped
and started again on the same port and store (an outage), and read back through its REST
API."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180.0) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).with_name("mlflow")
        log = open(self.folder / "server.log", "ab")
        self.process = subprocess.Popen(
            [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
             "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_ENABLE_TELEMETRY": "false"})
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not come up"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def get(self, route: str, **params: Any) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/api/2.0/mlflow/{route}", params=params, timeout=30)
        answer.raise_for_status()
        return dict(answer.json())

    def history(self, run_id: str, key: str) -> dict[int, list[float]]:
        """A metric's values by step, every page."""
        out: dict[int, list[float]] = {}
        token = None
        while True:
            page = self.get("metrics/get-history", run_id=run_id, metric_key=key,
                            max_results=25000, **({"page_token": token} if token else {}))
            for metric in page.get("metrics", []):
                out.setdefault(int(metric["step"]), []).append(float(metric["value"]))
            token = page.get("next_page_token")
            if not token:
                return out
