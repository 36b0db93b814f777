"""How `ray up`, `ray exec`, `ray submit`, `ray attach` and `ray down` reach a RunPod pod:
Ray's own SSH command runner, pointed at the pod's mapped SSH port, with files copied over
that same SSH connection as a tar stream.

Why not Ray's runner as it is: it connects to port 22 of a node's address, and RunPod maps a
pod's port 22 to another public port (v2's `ssh.direct` {host, port} of the pod). Its
`ssh` takes `-o Port=...` (the port goes in the options it builds, so the control path, the
retries and the login-shell wrapping stay Ray's). Its file sync runs `rsync` on both ends,
and RunPod's images do not ship rsync: `tar` and `cat` over ssh need nothing on the pod
but a shell, and nothing here but the ssh client. Ray's rsync filters (`rsync_exclude`,
`rsync_filter`) do not apply to this copy; a directory is copied as its contents, as Ray's
updater asks of rsync.
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from typing import Any

# Ray's SSH runner has no public home; the provider interface hands it out
# (NodeProvider.get_command_runner). tests/service/test_ray_private.py checks what is used here.
from ray.autoscaler._private.command_runner import SSHCommandRunner

logger = logging.getLogger(__name__)


class RunPodCommandRunner(SSHCommandRunner):
    """SSHCommandRunner for a pod: its address and mapped SSH port from the provider."""

    def _get_node_ip(self) -> str | None:
        address = self.provider.ssh_address(self.node_id, public=not self.use_internal_ip)
        if address is None:
            return None  # not yet: Ray's runner waits and asks again
        ip, port = address
        self.ssh_options.arg_dict["Port"] = port
        return ip

    def _target(self) -> str:
        return f"{self.ssh_user}@{self._get_ssh_target()}"

    def _ssh(self, remote_command: str) -> str:
        target = self._target()  # first: finding the pod's address sets its port
        ssh = ["ssh", *self.ssh_options.to_ssh_options_list(timeout=120), target]
        return shlex.join(ssh) + " " + shlex.quote(remote_command)

    def _pipe(self, pipeline: str) -> None:
        logger.debug("running %s", pipeline)
        self._run_helper(["bash", "-c", "set -o pipefail; " + pipeline])

    def run_rsync_up(self, source: str, target: str, options: Any = None) -> None:
        remote = remote_path(target)
        if os.path.isdir(source):
            self._pipe(f"tar -C {shlex.quote(source)} -cf - . | " + self._ssh(
                f"mkdir -p {remote} && tar -C {remote} -xf -"))
        else:
            self._pipe(f"cat {shlex.quote(source)} | " + self._ssh(
                f"mkdir -p \"$(dirname {remote})\" && cat > {remote}"))

    def run_rsync_down(self, source: str, target: str, options: Any = None) -> None:
        remote = remote_path(source.rstrip("/") or "/")
        with tempfile.TemporaryDirectory() as landing:
            self._pipe(self._ssh(f"cd \"$(dirname {remote})\" && tar -cf - "
                                 f"\"$(basename {remote})\"")
                       + f" | tar -C {shlex.quote(landing)} -xf -")
            [name] = os.listdir(landing)
            copied = os.path.join(landing, name)
            if os.path.isdir(copied):
                os.makedirs(target, exist_ok=True)
                for entry in os.listdir(copied):
                    os.replace(os.path.join(copied, entry), os.path.join(target, entry))
            else:
                os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
                os.replace(copied, target)

    def remote_shell_command_str(self) -> str:
        target = self._target()  # first: finding the pod's address sets its port
        key = f"-i {self.ssh_private_key} " if self.ssh_private_key else ""
        port = self.ssh_options.arg_dict.get("Port", 22)
        return f"ssh -o IdentitiesOnly=yes {key}-p {port} {target}\n"


def remote_path(path: str) -> str:
    """A path for the pod's shell: a leading ~ expands there, the rest is quoted."""
    if path == "~" or path.startswith("~/"):
        return "~/" + shlex.quote(path[2:]) if path[2:] else "~"
    return shlex.quote(path)
