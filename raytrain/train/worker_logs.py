"""Each training worker's output, kept with its job: `<job root>/logs/rank-<r>.log`.

A worker's stdout and stderr (print, logging, warnings, tracebacks, native libraries writing
to file descriptors 1 and 2) go through a pipe to a thread that appends them to the rank's
file, so a job's output is in one place on the job's storage instead of streamed into the
service's terminal. The file is bounded: past `max_bytes` it becomes `rank-<r>.log.1`
(replacing an older one) and a fresh file starts, so a rank keeps at most twice `max_bytes`
(plus one pipe read).

Written by hand because it redirects file descriptors, which Python's logging handlers do not
see, and Ray's own worker logs are per process, not per job and rank.

    with captured_output(job_root / "logs", rank=0, header="attempt 1"):
        train(...)
    read_logs(job_root / "logs", offsets={0: 0}, max_bytes=65536)

With a job's storage in a bucket, `stored_output` writes the file on local disk and uploads it
every few seconds and at the end, and `read_stored_logs` reads it back from the bucket, so a
job's logs outlive the node that wrote them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

MAX_LOG_BYTES = 4 * 2**20
READ_BYTES = 65536
UPLOAD_EVERY_S = 5.0


def log_path(log_dir: Path, rank: int) -> Path:
    return log_dir / f"rank-{rank}.log"


class _Appender(threading.Thread):
    """Copies a pipe into the rank's file, rotating it past max_bytes."""

    def __init__(self, read_fd: int, path: Path, max_bytes: int) -> None:
        super().__init__(name="worker-log", daemon=True)
        self.read_fd, self.path, self.max_bytes = read_fd, path, max_bytes

    def run(self) -> None:
        file = open(self.path, "ab")
        size = file.tell()
        while chunk := os.read(self.read_fd, READ_BYTES):
            file.write(chunk)
            file.flush()
            size += len(chunk)
            if size >= self.max_bytes:
                file.close()
                os.replace(self.path, self.path.with_suffix(".log.1"))
                file, size = open(self.path, "ab"), 0
        file.close()
        os.close(self.read_fd)


def _fileno(stream: object) -> int | None:
    try:
        return int(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None


# Libraries whose start-up notices say nothing about the job, and would fill every rank's log
# (torchao's optional GPU kernels that do not load on this machine, torch's pytree deprecation
# notices for torchao's enums, triton's autotuner chatter): their errors still come through.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree", "triton")


def quiet_libraries() -> None:
    """Keep QUIET_LOGGERS' warnings (logging, and Python warnings from their modules) out of
    the job's logs; their errors stay."""
    import logging
    import warnings

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module=name.replace(".", r"\.") + r"(\.|$)")


@contextmanager
def captured_output(log_dir: Path, rank: int, header: str,
                    max_bytes: int = MAX_LOG_BYTES) -> Iterator[Path]:
    """Send this process's stdout and stderr to the rank's log file while inside (with the
    libraries' start-up notices left out: quiet_libraries)."""
    quiet_libraries()
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_path(log_dir, rank)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    read_fd, write_fd = os.pipe()
    appender = _Appender(read_fd, path, max_bytes)
    appender.start()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    # Python-level writers too, where sys.stdout/stderr were replaced by something that does
    # not write to the file descriptors (a test runner's capture, a notebook). Streams that
    # already write there stay: Ray Train tees print() when sys.stdout is not the original.
    python_streams = sys.stdout, sys.stderr
    if _fileno(sys.stdout) != 1:
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")
    if _fileno(sys.stderr) != 2:
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")
    try:
        os.write(1, f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} rank {rank}: {header}\n"
                 .encode())
        yield path
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = python_streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        appender.join(timeout=10)


@dataclass(frozen=True)
class LogChunk:
    rank: int
    text: str
    offset: int  # where the next read of this rank starts
    size: int  # the file's size now
    skipped: int  # bytes between the asked offset and the text (too far behind, or rotated)


def read_logs(log_dir: Path, offsets: dict[int, int] | None = None, rank: int | None = None,
              max_bytes: int = 65536) -> list[LogChunk]:
    """Each rank's output from its offset (default: the last `max_bytes`), at most `max_bytes`
    per rank. A rank whose file rotated since `offset` starts again from its new file."""
    chunks: list[LogChunk] = []
    if not log_dir.is_dir():
        return chunks
    ranks = sorted(int(p.stem.split("-")[1]) for p in log_dir.glob("rank-*.log")
                   if p.stem.split("-")[1].isdigit())
    for r in ranks if rank is None else [r for r in ranks if r == rank]:
        path = log_path(log_dir, r)
        size = path.stat().st_size
        start = (offsets or {}).get(r, max(0, size - max_bytes))
        start = 0 if start > size else start  # rotated: the old offset is past the new file
        begin = max(start, size - max_bytes)
        with open(path, "rb") as file:
            file.seek(begin)
            data = file.read(size - begin)
        chunks.append(LogChunk(r, data.decode("utf-8", "replace"), begin + len(data), size,
                               begin - start))
    return chunks


@contextmanager
def stored_output(log_uri: str, rank: int, header: str,
                  every_s: float = UPLOAD_EVERY_S) -> Iterator[None]:
    """captured_output into the job's log folder or, for a bucket, into a local file that is
    uploaded every `every_s` while inside and once more on the way out."""
    from raytrain.cloud.object_store import is_remote, open_store

    if not is_remote(log_uri):
        with captured_output(Path(log_uri), rank, header):
            yield
        return
    store = open_store(log_uri)
    local = Path(tempfile.mkdtemp(prefix="raytrain-logs-"))
    done = threading.Event()
    sizes: dict[str, int] = {}

    def upload() -> None:
        for path in (log_path(local, rank), log_path(local, rank).with_suffix(".log.1")):
            if path.is_file() and sizes.get(path.name) != path.stat().st_size:
                try:
                    store.put_file(path, path.name)
                    sizes[path.name] = path.stat().st_size
                except Exception:  # noqa: BLE001 - the store may be down: the next round
                    pass

    def loop() -> None:
        while not done.wait(every_s):
            upload()

    shipper = threading.Thread(target=loop, name="worker-log-upload", daemon=True)
    shipper.start()
    try:
        with captured_output(local, rank, header):
            yield
    finally:
        done.set()
        shipper.join(timeout=every_s + 30)
        upload()


def read_stored_logs(log_uri: str, offsets: dict[int, int] | None = None,
                     rank: int | None = None, max_bytes: int = 65536) -> list[LogChunk]:
    """read_logs for a job's log folder or bucket prefix."""
    from raytrain.cloud.object_store import is_remote, open_store

    if not is_remote(log_uri):
        return read_logs(Path(log_uri), offsets, rank, max_bytes)
    store = open_store(log_uri)
    with tempfile.TemporaryDirectory(prefix="raytrain-logs-") as folder:
        for key in store.keys(""):
            name = key.rpartition("/")[2]
            if name.startswith("rank-") and name.endswith(".log") and (
                    rank is None or name == f"rank-{rank}.log"):
                store.get_file(key, Path(folder) / name)
        return read_logs(Path(folder), offsets, rank, max_bytes)
