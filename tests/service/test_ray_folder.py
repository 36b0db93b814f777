"""Where a Ray cluster raytrain starts keeps its session folders (its logs and sockets): under
the state directory, not in /tmp/ray (tests/service/ray/test_getting_started.py starts one
there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytrain.serve.deploy import KEEP_RAY_SESSIONS, RAY_FOLDER_MAX_BYTES, ray_folder


def test_a_short_state_dir_holds_rays_sessions_and_a_long_one_links_to_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/tmp")  # a relative state dir: the folder is named absolutely
    short = Path(f"rt-{os.getpid()}")
    try:
        assert ray_folder(short) == f"/tmp/rt-{os.getpid()}/ray"
        assert Path(f"/tmp/rt-{os.getpid()}/ray").is_dir()
    finally:
        shutil.rmtree(f"/tmp/rt-{os.getpid()}")
    long = tmp_path / ("x" * RAY_FOLDER_MAX_BYTES) / "state"
    folder = ray_folder(long)
    # Ray's longest socket path in it fits the 107 bytes of a Unix socket's address
    assert len(folder + "/session_2026-12-04_09-30-00_123456_4194304/sockets/plasma_store") \
        <= 107
    assert (long / "ray").is_symlink() and (long / "ray").resolve() == Path(folder).resolve()
    assert ray_folder(long) == folder  # the same state dir, the same folder


def test_finished_sessions_beyond_the_newest_are_removed_but_never_one_in_use(
        tmp_path: Path) -> None:
    """Fails if pruning is skipped (eight folders stay) or ignores a live process's session."""
    folder = Path(ray_folder(tmp_path / "s"))
    names = [f"session_2026-12-0{day}_10-00-00_000000_{day}" for day in range(1, 9)]
    for age, name in enumerate(reversed(names)):  # the last is the newest
        (folder / name / "logs").mkdir(parents=True)
        stamp = time.time() - 1000 * (age + 1)
        os.utime(folder / name, (stamp, stamp))
    oldest = folder / names[0]
    # A process of the oldest session is still running (its path on its command line).
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              f"--session_dir={oldest}"])
    try:
        ray_folder(tmp_path / "s")
        kept = sorted(p.name for p in folder.iterdir() if p.name.startswith("session_2"))
    finally:
        alive.kill()
        alive.wait()
    assert kept == sorted([names[0], *names[-KEEP_RAY_SESSIONS:]])
