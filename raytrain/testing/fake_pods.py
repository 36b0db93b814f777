"""Pods of the fake RunPod (raytrain/testing/runpod_api.py) that answer SSH as RunPod's images do: a
pod created with a public SSH port is an SSH server (asyncssh) on 127.0.0.1, at the port
RunPod says it maps the pod's port 22 to. It lets in the key in the pod's PUBLIC_KEY, and
runs each command with bash in the pod's environment (RunPod's images pass it to SSH
sessions), in the pod's own home folder.

What the pod runs carries the pod's id in its environment (POD_ENV), so that:
- `ray stop` in the pod stops what the pod runs and nothing else on this host, as it would
  inside the pod's container (the pod's PATH starts with a `ray` that does that for `stop`
  and is Ray's own for everything else);
- terminating the pod kills all of it, as RunPod stopping the container would.

    pods = PodServers(); port = pods.start(pod_id, env, home); pods.stop(pod_id)
    python raytrain/testing/fake_pods.py stop POD_ID    # the pod's `ray stop`
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import Any, Collection

import psutil

POD_ENV = "FAKE_RUNPOD_POD_ID"
BIN = Path(sys.executable).parent
RAY_IN_A_POD = """#!/usr/bin/env bash
# Ray, as installed in the pod; its `ray stop` stops only what this pod runs (a container's).
if [ "$1" = stop ]; then exec {python} {this} stop "${pod_env}"; fi
exec {ray} "$@"
"""


class PodServers:
    """One asyncio loop, in a thread, serving every pod's SSH."""

    def __init__(self) -> None:
        import asyncssh

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.servers: dict[str, Any] = {}

    def start(self, pod_id: str, env: dict[str, str], home: Path) -> int:
        """Serve the pod's SSH; the port it listens on."""
        home.mkdir(parents=True, exist_ok=True)
        bin_dir = home / ".pod-bin"
        bin_dir.mkdir(exist_ok=True)
        ray = bin_dir / "ray"
        ray.write_text(RAY_IN_A_POD.format(python=sys.executable, this=Path(__file__).resolve(),
                                           pod_env=POD_ENV, ray=BIN / "ray"))
        ray.chmod(0o755)
        # The image's PATH: a login shell's /etc/profile resets it, and Ray sources ~/.bashrc.
        (home / ".bashrc").write_text(f'export PATH="{bin_dir}:{BIN}:$PATH"\n')
        session_env = {**env, POD_ENV: pod_id, "HOME": str(home),
                       "PATH": f"{bin_dir}:{BIN}:{os.environ.get('PATH', '')}"}
        future = asyncio.run_coroutine_threadsafe(self._serve(pod_id, session_env, home),
                                                  self.loop)
        return future.result(timeout=30)

    async def _serve(self, pod_id: str, env: dict[str, str], home: Path) -> int:
        import asyncssh

        keys = asyncssh.import_authorized_keys(env["PUBLIC_KEY"])

        async def run(process: Any) -> None:
            command = process.command if process.command is not None else "exec bash -i"
            child = await asyncio.create_subprocess_exec(
                "bash", "-c", command, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                cwd=home)
            # No EOF to the client when the command's output ends: exit() sends the status,
            # then EOF (an OpenSSH client sharing a connection, as Ray's does, reads no
            # status after an EOF, and exits 255).
            await process.redirect(stdin=child.stdin, stdout=child.stdout,
                                   stderr=child.stderr, send_eof=False)
            code = await child.wait()
            # Daemons the command started may hold its output open: what it wrote is sent,
            # and the session ends with the command, as sshd's does.
            try:
                await asyncio.wait_for(process.stdout.drain(), 2)
            except Exception:  # noqa: BLE001 - a client gone or slow: the session ends anyway
                pass
            process.exit(code)
            try:
                await asyncio.wait_for(process.wait_closed(), 5)  # and its redirects end
            except Exception:  # noqa: BLE001 - as above
                pass

        server = await asyncssh.create_server(
            asyncssh.SSHServer, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=keys, process_factory=run, encoding=None,
            allow_scp=False)
        self.servers[pod_id] = server
        return int(server.sockets[0].getsockname()[1])

    def stop(self, pod_id: str) -> None:
        """The pod is gone: its SSH stops answering and everything it ran is killed."""
        server = self.servers.pop(pod_id, None)
        if server is not None:
            self.loop.call_soon_threadsafe(server.close)
        stop_pod_processes(pod_id, grace_s=0.0)

    def close(self) -> None:
        for pod_id in list(self.servers):
            self.stop(pod_id)
        self.loop.call_soon_threadsafe(self.loop.stop)


def pod_processes(pod_id: str, spare: Collection[int] = ()) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in spare:
            continue
        try:
            if proc.environ().get(POD_ENV) == pod_id:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def stop_pod_processes(pod_id: str, grace_s: float) -> None:
    """SIGTERM, then after `grace_s` SIGKILL, to what the pod runs (but this process and
    those it runs under)."""
    me = psutil.Process()
    spare = {me.pid, *(p.pid for p in me.parents())}
    found = pod_processes(pod_id, spare)
    for proc in found:
        try:
            proc.terminate() if grace_s else proc.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(found, timeout=grace_s or 5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


if __name__ == "__main__" and sys.argv[1:2] == ["stop"]:
    stop_pod_processes(sys.argv[2], grace_s=5.0)
    print("Stopped all Ray processes in this pod.")
