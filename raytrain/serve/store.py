"""Durable job records on the head node: one SQLite table of JobStatus documents.

The job manager writes a record on every state change, each checkpoint, and at most every
few seconds of progress, so a restarted service knows every job and its last state. Beside
each record it keeps the number the job's next event would take, so event numbers stay
monotonic across restarts (a client resuming with an old Last-Event-ID skips nothing). With
each write it keeps the service's tally (core.tally), so the counters /metrics shows keep
growing across a restart rather than starting again at zero. A second table keeps each job's
progress points (serve.history) for the dashboard's charts.

    store = JobStore(Path("~/.raytrain/jobs.db").expanduser())
    store.put(status, next_event_seq=12, tally={...}); store.load_all(); store.delete(job_id)
    store.save_points(job_id, {0: '{"n": 0, "step": 1, ...}'}); store.points(job_id)
    read_tally(Path("~/.raytrain/jobs.db").expanduser())   # read-only, beside a running service
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable

from raytrain.spec import JobStatus

STORE_FILE = "jobs.db"  # in the service's state directory


def read_tally(path: Path) -> dict[str, Any] | None:
    """The tally a service's store holds, read-only (the service may be running), or None
    when there is no store or no tally in it."""
    if not path.is_file():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return _tally_in(db)
    except sqlite3.Error:
        return None
    finally:
        db.close()


def _tally_in(db: sqlite3.Connection) -> dict[str, Any] | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'tally'").fetchone()
    return json.loads(row[0]) if row else None


class JobStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS jobs ("
            " id TEXT PRIMARY KEY, created_at REAL NOT NULL, record TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS points (job_id TEXT NOT NULL, "
                         "n INTEGER NOT NULL, point TEXT NOT NULL, PRIMARY KEY (job_id, n))")
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

    def points(self, job_id: str) -> list[str]:
        """A job's progress points (JSON texts) by report number."""
        with self._lock:
            rows = self._db.execute("SELECT point FROM points WHERE job_id = ? ORDER BY n",
                                    (job_id,)).fetchall()
        return [row[0] for row in rows]

    def writable(self) -> bool:
        """Whether a write goes through now (for readiness)."""
        try:
            with self._lock:
                self._db.execute("CREATE TABLE IF NOT EXISTS probe (x INTEGER)")
            return True
        except sqlite3.Error:
            return False

    def close(self) -> None:
        with self._lock:
            self._db.close()
