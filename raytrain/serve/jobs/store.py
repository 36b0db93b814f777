"""Durable job records on the head node: one SQLite table of JobStatus documents.

The job manager writes a record on every state change, each checkpoint, and at most every
few seconds of progress, so a restarted service knows every job and its last state. Beside
each record it keeps the number the job's next event would take, so event numbers stay
monotonic across restarts (a client resuming with an old Last-Event-ID skips nothing). With
each write it keeps the service's tally (core.tally), so the counters /metrics shows keep
growing across a restart rather than starting again at zero. A second table keeps each job's
progress points (serve.jobs.history) for the dashboard's charts.

    store = JobStore(Path("~/.raytrain/jobs.db").expanduser())
    store.put(status, next_event_seq=12, tally={...}); store.load_all(); store.delete(job_id)
    store.save_points(job_id, {0: '{"n": 0, "step": 1, ...}'}); store.points(job_id)
    read_tally(Path("~/.raytrain/jobs.db").expanduser())   # read-only, beside a running service

The database keeps a rollback journal (no memory-mapped -shm file); when a running service
holds it locked, read_tally reads the tally's copy in tally.json, written at most every
TALLY_COPY_EVERY_S.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from raytrain.spec import JobStatus

STORE_FILE = "jobs.db"  # in the service's state directory
TALLY_COPY_EVERY_S = 10.0


TALLY_FILE = "tally.json"  # beside it: a running service's tally, for other processes


def read_tally(path: Path) -> dict[str, Any] | None:
    """The tally a service's store holds (read-only), or, while a service holds the store,
    the copy it keeps beside it; None when there is neither."""
    if path.is_file():
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return _tally_in(db)
        except sqlite3.Error:
            pass  # held by a running service
        finally:
            db.close()
    try:
        tally: dict[str, Any] = json.loads((path.parent / TALLY_FILE).read_text())
        return tally
    except (OSError, ValueError):
        return None


def write_tally_copy(path: Path, tally: dict[str, Any]) -> None:
    """The copy read_tally reads beside a running service (owner-only, replaced whole)."""
    partial = path.parent / (TALLY_FILE + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(json.dumps(tally))
    os.replace(partial, path.parent / TALLY_FILE)


def _tally_in(db: sqlite3.Connection) -> dict[str, Any] | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'tally'").fetchone()
    return json.loads(row[0]) if row else None


class JobStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        if not path.exists():  # readable by its owner only, like tokens.json
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        # A rollback journal, not WAL: WAL's memory-mapped -shm file turns a disk that stops
        # taking writes into SIGBUS, where a journal fails the write (serve.jobs.durable keeps it).
        # A reader beside a writer may find the file locked: read_tally then reads TALLY_FILE.
        self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs ("
            " id TEXT PRIMARY KEY, created_at REAL NOT NULL, record TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS points (job_id TEXT NOT NULL, "
                         "n INTEGER NOT NULL, point TEXT NOT NULL, PRIMARY KEY (job_id, n))")
        # Every optimizer step's figures (serve.jobs.history.StepRows): a step done again after a
        # restart replaces its earlier row.
        self._db.execute("CREATE TABLE IF NOT EXISTS steps (job_id TEXT NOT NULL, "
                         "step INTEGER NOT NULL, loss REAL, lr REAL, grad_norm REAL, "
                         "tokens INTEGER, PRIMARY KEY (job_id, step))")
        for companion in (path, path.with_name(path.name + "-journal")):
            try:
                os.chmod(companion, 0o600)
            except OSError:
                pass
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
        if "next_event_seq" not in columns:  # a store written before events were numbered
            self._db.execute("ALTER TABLE jobs ADD COLUMN next_event_seq INTEGER NOT NULL "
                             "DEFAULT 0")

    def put(self, status: JobStatus, next_event_seq: int = 0,
            tally: dict[str, Any] | None = None) -> None:
        """Write a job's record, and the service's tally with it (one transaction)."""
        with self._lock, self._db:  # commits, or rolls back on an error
            self._db.execute("BEGIN")
            if tally is not None:
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('tally', ?)",
                                 (json.dumps(tally),))
            self._db.execute(
                "INSERT INTO jobs (id, created_at, record, next_event_seq) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET record = excluded.record, "
                "next_event_seq = MAX(next_event_seq, excluded.next_event_seq)",
                (status.id, status.created_at, status.model_dump_json(), next_event_seq),
            )

    def get_tally(self) -> dict[str, Any] | None:
        with self._lock:
            return _tally_in(self._db)

    def load_all(self) -> list[tuple[JobStatus, int]]:
        """Every record, oldest first, with the number its next event takes."""
        with self._lock:
            rows = self._db.execute(
                "SELECT record, next_event_seq FROM jobs ORDER BY created_at").fetchall()
        return [(JobStatus.model_validate_json(record), seq) for record, seq in rows]

    def delete(self, job_id: str) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            self._db.execute("DELETE FROM points WHERE job_id = ?", (job_id,))
            self._db.execute("DELETE FROM steps WHERE job_id = ?", (job_id,))

    def save_points(self, job_id: str, points: dict[int, str], drop: Iterable[int] = ()) -> None:
        """Write a job's progress points {report number: JSON text} and remove the numbers in
        `drop` (thinned out), in one transaction."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM points WHERE job_id = ? AND n = ?",
                                 [(job_id, n) for n in drop])
            self._db.executemany("INSERT OR REPLACE INTO points (job_id, n, point) "
                                 "VALUES (?, ?, ?)",
                                 [(job_id, n, point) for n, point in points.items()])

    def save_steps(self, job_id: str, rows: Iterable[tuple[int, float | None, float | None,
                                                          float | None, int | None]]) -> None:
        """Write steps' rows (step, loss, lr, grad_norm, tokens), replacing any of the same
        step (done again after a restart), in one transaction."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO steps (job_id, step, loss, lr, "
                                 "grad_norm, tokens) VALUES (?, ?, ?, ?, ?, ?)",
                                 [(job_id, *row) for row in rows])

    def steps(self, job_id: str, after_step: int, limit: int
              ) -> list[tuple[int, float | None, float | None, float | None, int | None]]:
        """Up to `limit` of a job's step rows with a step above `after_step`, by step."""
        with self._lock:
            return self._db.execute(
                "SELECT step, loss, lr, grad_norm, tokens FROM steps WHERE job_id = ? AND "
                "step > ? ORDER BY step LIMIT ?", (job_id, after_step, limit)).fetchall()

    def points(self, job_id: str) -> list[str]:
        """A job's progress points (JSON texts) by report number."""
        with self._lock:
            rows = self._db.execute("SELECT point FROM points WHERE job_id = ? ORDER BY n",
                                    (job_id,)).fetchall()
        return [row[0] for row in rows]

    def probe(self) -> None:
        """A real write (readiness): raises sqlite3.Error if the disk does not take it."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)",
                             (repr(time.time()),))

    def close(self) -> None:
        with self._lock:
            self._db.close()
