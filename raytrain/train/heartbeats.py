"""Every rank of every replica group beats a counter in the job's beat store (a TCPStore
the runner holds beside the Lighthouse); a rank waiting on the groups' all-reduce longer
than a moment reads the counters of the other groups' ranks, and a group any of whose ranks
has not beaten for `lost_after_s` is lost. Each rank also watches its own group's ranks: one
of them silent has taken the group with it (the group's collectives would wait on it
forever), so the rank ends, its sockets close, and the other groups and the Lighthouse hear
the group go. So a group whose node vanishes without closing a socket (power, a network
partition, a process frozen) is noticed within seconds, by a heartbeat, not by the
collective's timeout (30 s, which a slow step must stay under).

Why by hand: torchft's Lighthouse drops a silent group from the next quorum, but a group
already in the step's quorum is waited for until gloo's timeout, and gloo's `abort()` does
not wake a pending operation (measured: the wait ran to the peer's exit). The Lighthouse
does not say which replicas it hears except on its HTML dashboard. Counters, not clocks:
hosts' clocks are not compared; each watcher times a counter that does not move with its
own monotonic clock.

    beats = Heartbeats("10.0.0.5:41234", group=1, rank=0, world_size=2)
    beats.start()                                    # a daemon thread: add 1 every 0.5 s
    lost = wait_watched(futures, beats, groups={0})  # groups lost while waiting, or none
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

BEAT_S = 0.5  # how often each rank beats
LOST_AFTER_S = 4.0  # a counter still this long (8 beats missed; the Lighthouse's own: 3 s)
WATCH_AFTER_S = 0.5  # a wait this long, and the watcher starts reading the counters
WATCH_EVERY_S = 0.25
LEFT = 1 << 40  # added to a rank's counter as its group leaves: a group gone, not silent
GROUP_LOST_EXIT = 19  # a rank's exit status when a rank of its group fell silent


class Heartbeats:
    """This rank's beat, and its reading of the others' (module doc). `address`:
    "host:port" of the job's beat store."""

    def __init__(self, address: str, group: int, rank: int, world_size: int,
                 beat_s: float = BEAT_S, lost_after_s: float = LOST_AFTER_S) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.group, self.rank, self.world_size = group, rank, world_size
        self.beat_s, self.lost_after_s = beat_s, lost_after_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader: Any = None
        self._seen: dict[str, tuple[int, float, bool]] = {}  # key -> (count, when it last
        # moved, whether it was seen to move)

    def _client(self) -> Any:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        return TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                        timeout=timedelta(seconds=10))

    def start(self) -> None:
        self._reader = self._client()
        key = _key(self.group, self.rank)
        if int(self._reader.add(key, 0)) >= LEFT:  # this group's earlier life left
            self._reader.add(key, -LEFT)
        self._thread = threading.Thread(target=self._beat, args=(self._client(),),
                                        name="raytrain-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, store: Any) -> None:
        """Beat, and watch this group's other ranks: one silent for lost_after_s has taken
        the group with it (its collectives wait on that rank forever), so this rank ends,
        closing its sockets, and the other groups and the Lighthouse hear the group go."""
        key = _key(self.group, self.rank)
        mates = [_key(self.group, r) for r in range(self.world_size) if r != self.rank]
        seen: dict[str, tuple[int, float, bool]] = {}
        while not self._stop.is_set():
            try:
                store.add(key, 1)
                silent = _still(store, mates, seen, time.monotonic(), self.lost_after_s,
                                seen_moving=True)
            except Exception as error:  # noqa: BLE001 - the runner gone: the job ends anyway
                logger.debug("heartbeat not sent: %s", error)
                silent = []
            if silent and not self._stop.is_set():
                logger.error("%s of this replica group silent for %.0f s: the group is lost, "
                             "and this rank ends so that the others hear it", silent[0],
                             self.lost_after_s)
                self.on_group_lost()
                return
            self._stop.wait(self.beat_s)

    def on_group_lost(self) -> None:
        os._exit(GROUP_LOST_EXIT)

    def stop(self) -> None:
        """This rank ends (its group left, or the job is done): no longer watched."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._reader.add(_key(self.group, self.rank), LEFT)
        except Exception as error:  # noqa: BLE001 - the runner gone: the job ends anyway
            logger.debug("heartbeat not closed: %s", error)

    def forget(self) -> None:
        """Start the next watch afresh: a counter's last move is timed only within one wait."""
        self._seen.clear()

    def silent(self, groups: Iterable[int], now: float | None = None) -> set[int]:
        """Of `groups` (not this one), those with a rank whose counter has not moved for
        lost_after_s of this watcher's watching."""
        now = time.monotonic() if now is None else now
        lost = set()
        for group in groups:
            if group == self.group:
                continue
            keys = [_key(group, rank) for rank in range(self.world_size)]
            if _still(self._reader, keys, self._seen, now, self.lost_after_s):
                lost.add(group)
        return lost


def _still(store: Any, keys: list[str], seen: dict[str, tuple[int, float, bool]], now: float,
           lost_after_s: float, seen_moving: bool = False) -> list[str]:
    """Of `keys`, the counters that have not moved for lost_after_s since `seen` (updated)
    first saw them or saw them move; a counter that never beat (its rank not started) or
    that left is not still. `seen_moving`: only a counter seen to move since the watch began
    (a group's own ranks, watched from their start: a replacement's mate that has not begun
    beating shows the count its predecessor left, which does not move)."""
    still = []
    for key in keys:
        count = int(store.add(key, 0))  # a read that never blocks on a key not yet there
        if count == 0 or count >= LEFT:
            continue
        last = seen.get(key)
        if last is None or last[0] != count:
            seen[key] = (count, now, last is not None)
        elif now - last[1] >= lost_after_s and (last[2] or not seen_moving):
            still.append(key)
    return still


def _key(group: int, rank: int) -> str:
    return f"beat/{group}/{rank}"


def wait_watched(futures: Sequence[Any], beats: Heartbeats | None, groups: Iterable[int],
                 watch_after_s: float = WATCH_AFTER_S, every_s: float = WATCH_EVERY_S
                 ) -> set[int]:
    """Wait until every future (torch futures of the step's collectives) is done, or a
    group of `groups` falls silent: the groups lost (then the futures are left pending:
    nothing waits on them again), or an empty set once all are done."""
    done = threading.Event()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Any) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    if not futures:
        return set()
    for future in futures:
        future.add_done_callback(one_done)
    if done.wait(watch_after_s) or beats is None:
        done.wait()
        return set()
    watched = set(groups) - {beats.group}
    beats.forget()
    while not done.wait(every_s):
        lost = beats.silent(watched)
        if lost:
            return lost
    return set()
