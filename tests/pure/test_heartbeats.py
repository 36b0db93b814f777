"""The counters replica groups beat (raytrain.train.heartbeats), read on a real TCPStore in
this process, with the watcher's clock given: a rank silent for the limit is found, one that
never began or that left is not, and a replacement's mate that has not begun beating (its
predecessor's count standing still) is not taken for a silent one by its own group."""

from __future__ import annotations

from torch.distributed import TCPStore

from raytrain.train.heartbeats import LEFT, _key, _still


def test_a_still_counter_is_found_and_a_new_or_departed_one_is_not() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    live, frozen, new, left = (_key(1, r) for r in range(4))
    store.add(live, 5)
    store.add(frozen, 7)
    store.add(left, 3 + LEFT)
    seen: dict = {}
    keys = [live, frozen, new, left]
    assert _still(store, keys, seen, 0.0, 4.0) == []  # first sight: the baseline
    store.add(live, 1)
    assert _still(store, keys, seen, 3.9, 4.0) == []
    store.add(live, 1)
    assert _still(store, keys, seen, 4.0, 4.0) == [frozen]  # 4 s without a beat


def test_a_groups_own_watch_waits_for_a_mate_to_begin_beating() -> None:
    """A killed group's ranks leave their counts; its replacement's rank 1 may start beating
    seconds after rank 0. Counted from first sight (as a watch between groups does), rank 0
    would end its group for a mate merely starting; from the first move it does not, and a
    mate that beat and then stopped is still found. (Drop `seen_moving` and the first
    assertion fails.)"""
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mate = _key(2, 1)
    store.add(mate, 40)  # what the killed predecessor left
    seen: dict = {}
    assert _still(store, [mate], seen, 0.0, 4.0, seen_moving=True) == []
    assert _still(store, [mate], seen, 10.0, 4.0, seen_moving=True) == []  # not begun yet
    store.add(mate, 1)  # it begins
    assert _still(store, [mate], seen, 11.0, 4.0, seen_moving=True) == []
    assert _still(store, [mate], seen, 15.0, 4.0, seen_moving=True) == [mate]  # then stops
