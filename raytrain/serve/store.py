"""Durable job records on the head node: one SQLite table of JobStatus documents.

The job manager writes a record on every state change, each checkpoint, and at most every
few seconds of progress, so a restarted service knows every job and its last state.

    store = JobStore(Path("~/.raytrain/jobs.db").expanduser())
    store.put(status); store.load_all()
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from raytrain.spec import JobStatus


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

    def put(self, status: JobStatus) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO jobs (id, created_at, record) VALUES (?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET record = excluded.record",
                (status.id, status.created_at, status.model_dump_json()),
            )

    def load_all(self) -> list[JobStatus]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM jobs ORDER BY created_at").fetchall()
        return [JobStatus.model_validate_json(row[0]) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
