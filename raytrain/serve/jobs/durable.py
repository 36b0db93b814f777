"""The job manager's records, kept through a failing disk and a lost head node.

Two copies, with one promise: what they end up holding is what the API said.
- SQLite on the head node (serve.jobs.store.JobStore), written in the caller's thread. When it
  cannot be written (a full or read-only disk, an immutable file), nothing raises into the
  caller (a training rank's report, the scheduler): the newest record of each job is kept in
  memory and written, with the tally, once the disk takes writes again (`flush`, every
  scheduler pass). While anything waits, the service is `degraded`: /readyz answers 503 with
  the cause and write endpoints answer 503 with Retry-After, so no client is told of a change
  that the disk does not hold.
- A mirror in the job storage when that is an object store (`_service/` in the bucket): every
  record as `jobs/<id>.json` with the number of its next event, the tally, and the tokens'
  SHA-256 digests (never a token), uploaded by a thread of its own so the bucket's latency
  never holds the manager's lock. A new head node with an empty state directory and the same
  storage reads them back (`load`), so it lists every job and resumes the ones that were
  running.
- A lease (`_service/lease.json`: holder, host, renewed_at) renewed by that thread with a
  conditional write (S3's If-Match on the version it wrote last): a second service on the
  same storage waits a lease's time to see whether it is still renewed (the head that held
  it is gone if not), refuses to start while it is, naming its holder, and takes it over
  with a conditional write too, so of two heads racing exactly one holds it; a service whose
  lease was taken over stops writing at its next renewal.

Written here because SQLite and the bucket differ in what they promise (a transaction against
a put per object), and neither says how to buffer through its own outage.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from raytrain.cloud.object_store import Store
from raytrain.errors import RaytrainError, StoreError
from raytrain.serve.jobs.store import TALLY_COPY_EVERY_S, JobStore, write_tally_copy
from raytrain.spec import JobStatus

logger = logging.getLogger(__name__)

SERVICE_PREFIX = "_service"
LEASE_KEY = f"{SERVICE_PREFIX}/lease.json"
TALLY_KEY = f"{SERVICE_PREFIX}/tally.json"
DIGESTS_KEY = f"{SERVICE_PREFIX}/token_digests.json"
JOBS_PREFIX = f"{SERVICE_PREFIX}/jobs/"
ID_FILE = "service_id"
RETRY_AFTER_S = 5
READ_THREADS = 10  # a new head reads the mirrored records this many at a time (boto3 pools 10)


def service_id(state_dir: Path) -> str:
    """This service's identity (one per state directory, kept across restarts)."""
    path = state_dir / ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        state_dir.mkdir(parents=True, exist_ok=True)
        ident = uuid.uuid4().hex[:12]
        path.write_text(ident)
        return ident


class DurableRecords:
    def __init__(self, db: JobStore, mirror: Store | None = None, holder: str = "",
                 lease_s: float = 30.0) -> None:
        self.db, self.mirror = db, mirror
        self.holder = holder or uuid.uuid4().hex[:12]
        self.lease_s = lease_s
        self.degraded: str | None = None  # why the disk does not take writes
        self.mirror_degraded: str | None = None  # why the bucket does not
        self._pending: dict[str, tuple[JobStatus, int] | None] = {}  # None: a deletion
        self._tally: dict[str, Any] | None = None
        self._tally_copied = float("-inf")
        self._lock = threading.Lock()
        self._to_mirror: dict[str, bytes | None] = {}
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_tag = ""  # the version of the lease this service last wrote

    # ------------------------------------------------------------------ start and stop

    def start(self, wait_for_lease: Callable[[str], None] | None = None) -> None:
        """Take the lease (waiting for one left by a lost head to lapse) and start the
        mirror's thread; raise naming the holder if another service renews it."""
        if self.mirror is None:
            return
        self._lease_tag = acquire_lease(self.mirror, self.holder, self.lease_s,
                                        wait_for_lease)
        self._thread = threading.Thread(target=self._mirror_forever, name="record-mirror",
                                        daemon=True)
        self._thread.start()

    def stop_mirror(self) -> None:
        """Stop copying to the bucket and renewing the lease (as a lost head does)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def close(self) -> None:
        """Write what waits, and hand the lease back."""
        self.flush()
        self.stop_mirror()
        if self._thread is not None:
            try:
                self._upload()
                self.mirror.delete_prefix(LEASE_KEY)  # type: ignore[union-attr]
            except StoreError as exc:
                logger.error("could not hand back the lease on %s: %s", self.mirror, exc)

    # ------------------------------------------------------------------ reading back

    def load(self) -> tuple[list[tuple[JobStatus, int]], dict[str, Any] | None]:
        """Every record with its next event number, and the tally: from SQLite or, when it
        holds none (a new head node), from the mirror, which is then written to SQLite."""
        loaded, tally = self.db.load_all(), self.db.get_tally()
        if loaded or self.mirror is None:
            return loaded, tally
        loaded, tally = read_mirror(self.mirror)
        for status, seq in loaded:
            self.db.put(status, seq, tally)
        if loaded:
            logger.info("recovered %d job records from %s", len(loaded), self.mirror)
        return loaded, tally

    def mirrored_digests(self) -> dict[str, str]:
        if self.mirror is None:
            return {}
        try:
            data = self.mirror.get_bytes(DIGESTS_KEY)
        except StoreError:
            return {}
        return json.loads(data) if data else {}

    def mirror_digests(self, digests: dict[str, str]) -> None:
        if self.mirror is not None:
            self._queue(DIGESTS_KEY, json.dumps(digests, sort_keys=True).encode())

    # ------------------------------------------------------------------ writing

    def put(self, status: JobStatus, next_event_seq: int,
            tally: dict[str, Any] | None = None) -> None:
        """Keep a job's record (never raises for a failing disk: module doc)."""
        with self._lock:
            self._pending[status.id] = (status, next_event_seq)
            if tally is not None:
                self._tally = tally
        self.flush()
        if self.mirror is not None:
            self._queue(f"{JOBS_PREFIX}{status.id}.json", json.dumps(
                {"record": status.model_dump(mode="json"), "next_event_seq": next_event_seq}
            ).encode())
            if tally is not None:
                self._queue(TALLY_KEY, json.dumps(tally).encode())

    def delete(self, job_id: str) -> None:
        with self._lock:
            self._pending[job_id] = None
        self.flush()
        if self.mirror is not None:
            self._queue(f"{JOBS_PREFIX}{job_id}.json", None)

    def flush(self) -> bool:
        """Write what waits, in the order it came; True when nothing waits any more."""
        with self._lock:
            while self._pending:
                job_id, record = next(iter(self._pending.items()))
                try:
                    if record is None:
                        self.db.delete(job_id)
                    else:
                        self.db.put(record[0], record[1], self._tally)
                except sqlite3.Error as exc:
                    if self.degraded is None:
                        logger.error("the job store %s does not take writes (%s): records "
                                     "are kept in memory and written once it does",
                                     self.db.path, exc)
                    self.degraded = f"the job store {self.db.path} does not take writes: {exc}"
                    return False
                del self._pending[job_id]
            if self._tally is not None and time.monotonic() - self._tally_copied >= \
                    TALLY_COPY_EVERY_S:
                try:
                    write_tally_copy(self.db.path, self._tally)
                    self._tally_copied = time.monotonic()
                except OSError:
                    pass  # the copy is for other processes; the store holds the tally
            if self.degraded is not None:
                logger.warning("the job store %s takes writes again: every record written",
                               self.db.path)
                self.degraded = None
            return True

    def writable(self) -> str | None:
        """None if the disk takes a real write now and nothing waits; else why not."""
        if not self.flush():
            return self.degraded
        try:
            self.db.probe()
        except sqlite3.Error as exc:
            return f"the job store {self.db.path} does not take writes: {exc}"
        return None

    # ------------------------------------------------------------------ the mirror

    def _queue(self, key: str, data: bytes | None) -> None:
        with self._wake:
            self._to_mirror[key] = data
            self._wake.notify_all()

    def _mirror_forever(self) -> None:
        renewed, wait = 0.0, 1.0
        while not self._stop.is_set():
            with self._wake:
                if not self._to_mirror and time.monotonic() - renewed < self.lease_s / 3:
                    self._wake.wait(timeout=self.lease_s / 3)
            if self._stop.is_set():
                return
            try:
                if time.monotonic() - renewed >= self.lease_s / 3:
                    self._lease_tag = renew_lease(self.mirror, self.holder,  # type: ignore[arg-type]
                                                  self._lease_tag)
                    renewed = time.monotonic()
                self._upload()
                if self.mirror_degraded is not None:
                    logger.warning("%s takes writes again", self.mirror)
                self.mirror_degraded, wait = None, 1.0
            except StoreError as exc:
                if self.mirror_degraded is None:
                    logger.error("cannot copy job records to %s (%s); trying again",
                                 self.mirror, exc)
                self.mirror_degraded = str(exc)
                self._stop.wait(wait)
                wait = min(30.0, wait * 2)
            except RaytrainError as exc:  # the lease was taken over: stop copying
                logger.error("%s", exc)
                self.mirror_degraded = str(exc)
                return

    def _upload(self) -> None:
        assert self.mirror is not None
        while True:
            with self._wake:
                if not self._to_mirror:
                    return
                key, data = next(iter(self._to_mirror.items()))
            if data is None:
                self.mirror.delete_prefix(key)
            else:
                self.mirror.put_bytes(key, data)
            with self._wake:
                if self._to_mirror.get(key, b"") is data:  # not changed meanwhile
                    del self._to_mirror[key]


def read_mirror(store: Store) -> tuple[list[tuple[JobStatus, int]], dict[str, Any] | None]:
    """The records and tally a service mirrored to `store`, oldest first."""
    loaded = []
    with ThreadPoolExecutor(READ_THREADS) as pool:  # one GET per record: a round trip each
        for data in pool.map(store.get_bytes, store.keys(JOBS_PREFIX)):
            if data is None:
                continue
            document = json.loads(data)
            loaded.append((JobStatus.model_validate(document["record"]),
                           int(document.get("next_event_seq", 0))))
    loaded.sort(key=lambda pair: pair[0].created_at)
    tally = store.get_bytes(TALLY_KEY)
    return loaded, json.loads(tally) if tally else None


def _lease(store: Store) -> tuple[dict[str, Any] | None, str | None]:
    data, tag = store.get_tagged(LEASE_KEY)
    return (json.loads(data) if data else None), tag


def _lease_document(holder: str) -> bytes:
    return json.dumps({"holder": holder, "host": socket.gethostname(), "pid": os.getpid(),
                       "renewed_at": time.time()}).encode()


def renew_lease(store: Store, holder: str, tag: str) -> str:
    """Renew the lease `holder` holds at version `tag` (a conditional write: it fails if
    anyone wrote the lease since); the new version. RaytrainError if it was taken over."""
    renewed = store.put_if(LEASE_KEY, _lease_document(holder), tag)
    if renewed is None:
        held, _ = _lease(store)
        raise RaytrainError(f"the service {(held or {}).get('holder')} on "
                            f"{(held or {}).get('host')} took over {store}; this one stops "
                            "writing to it")
    return renewed


def acquire_lease(store: Store, holder: str, lease_s: float,
                  progress: Callable[[str], None] | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> str:
    """Take `store`'s lease for `holder`; its version, for `renew_lease`.

    Atomic through the store's conditional writes (S3's If-None-Match / If-Match): a lease
    that is not there is created only if it still is not, and one held by another service is
    taken over only if it was not renewed for `lease_s` by this host's own clock (its
    version unchanged), and only if nobody else took it meanwhile. So of two heads racing
    for it exactly one wins, and no clocks are compared across hosts. The loser is told who
    holds it."""
    for _ in range(3):  # a lease that comes and goes while we look: look again
        held, tag = _lease(store)
        if held is None:
            taken = store.put_if(LEASE_KEY, _lease_document(holder), None)
        elif held.get("holder") == holder:  # ours (a restart of this service)
            taken = store.put_if(LEASE_KEY, _lease_document(holder), tag)
        else:
            if progress is not None:
                progress(f"{store} is leased by service {held.get('holder')} on "
                         f"{held.get('host')}; waiting {lease_s:.0f} s to see whether it is "
                         "still renewed")
            started = clock()
            sleep(lease_s + 0.5)
            while clock() - started < lease_s:  # a sleep that came back early
                sleep(0.5)
            now, now_tag = _lease(store)
            if now is not None and now_tag != tag:
                raise _held_by(store, now)
            taken = store.put_if(LEASE_KEY, _lease_document(holder), now_tag)  # unchanged
        if taken is not None:
            return taken
    held, _ = _lease(store)
    raise _held_by(store, held or {})


def _held_by(store: Store, held: dict[str, Any]) -> RaytrainError:
    return RaytrainError(
        f"another raytrain service drives {store}: service {held.get('holder')} on host "
        f"{held.get('host')} (pid {held.get('pid')}) holds its lease. Two services on one "
        "storage would run the same jobs twice. To fix: stop that service (`raytrain stop` "
        "on its head node), or give this one other storage (--storage-path)")
