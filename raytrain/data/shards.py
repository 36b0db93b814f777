"""Token shards: a folder of flat uint16/uint32 token files with an `index.json`, as
`raytrain data prepare` writes them, read as one stream of tokens (the shards in the index's
order, each document followed by the end-of-document token). Sample `i` is the window of
`seq_len + 1` tokens starting at `(i mod n) * seq_len` of that stream, as for a single token
file; a window may span two shards.

The folder may be a bucket's prefix (s3://BUCKET/PREFIX, through the service's storage
settings): then each rank fetches only the windows it trains on, each with one ranged GET,
a batch's windows side by side, into a cache on the node's disk (_BucketShard) that later
epochs, evaluations and runs read instead. The loop's prefetcher reads the next step's batch
while this one trains (the read-ahead), so the step does not wait on the bucket.

A masked folder (`data prepare --chat`) has a `.spans` file beside each shard: the token
ranges whose loss is taken. A window's tokens outside them are stored in its batch as
`-(id + 1)` (raytrain.data.masks), and `trained(indices)` counts a batch's trained targets
from the spans alone, reading no tokens.

    source = TokenShards("/data/corpus", seq_len=2048, vocab_size=32000)
    batch = source.batch(range(8))     # int64 [8, 2049]
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from raytrain.cloud.object_store import Store, is_remote, open_store
from raytrain.core.shuffle import windows
from raytrain.data.masks import untrained_marked
from raytrain.errors import FieldError, SpecError, StoreError

if TYPE_CHECKING:  # torch is imported where a batch is made: admission reads the index only
    import torch

INDEX = "index.json"
HERE = ("data", "path")
SPANS_DTYPE = np.dtype("<i8")


def read_index(folder: str | Path, endpoint: str | None = None) -> dict[str, Any]:
    """The folder's (or bucket prefix's) index; SpecError naming data.path when there is
    none or it is broken."""
    try:
        if is_remote(str(folder)):
            data = open_store(str(folder), endpoint).get_bytes(INDEX)
            if data is None:
                raise FileNotFoundError(f"no {INDEX} under that prefix")
            index = json.loads(data)
        else:
            index = json.loads((Path(folder) / INDEX).read_text())
        assert index["dtype"] in ("uint16", "uint32") and index["shards"]
    except (OSError, ValueError, KeyError, AssertionError, TypeError, StoreError) as exc:
        raise SpecError([FieldError(HERE, f"{folder} holds no readable {INDEX} ({exc}). To "
                                    "fix: give a folder or bucket prefix `raytrain data "
                                    "prepare` wrote (and uploaded whole), or a single token "
                                    "file")]) from None
    return dict(index)


class _BucketShard:
    """One shard in a bucket, sliced like a memmap, through a cache on this node's disk: a
    sparse file the shard's size holding the ranges fetched so far, and a log of those
    ranges (appended once their bytes are written, so a crash loses a fetch, never serves a
    hole). A slice that the log covers is read from the disk; any other is one ranged GET of
    exactly its bytes, written into the file at its place. So a rank fetches only the windows
    it trains on, once, and a later epoch, evaluation or run on this node reads them from
    disk. Ranks on one node share the files (the same bytes at the same places; each appends
    whole records)."""

    RECORD = np.dtype("<i8")  # the log: (start, stop) token pairs

    def __init__(self, store: Store, key: str, dtype: np.dtype, tokens: int,
                 cache: Path) -> None:
        self.store, self.key, self.dtype, self.tokens = store, key, dtype, tokens
        self.bytes_read = 0
        cache.mkdir(parents=True, exist_ok=True)
        self.path, log = cache / f"{key}.cache", cache / f"{key}.ranges"
        with open(self.path, "ab") as handle:  # sparse: no byte written until fetched
            if handle.tell() < tokens * dtype.itemsize:
                handle.truncate(tokens * dtype.itemsize)
        self._fd = os.open(self.path, os.O_RDWR)
        self._log = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._local = np.memmap(self.path, dtype=dtype, mode="r", shape=(tokens,))
        held = np.fromfile(log, dtype=self.RECORD) if log.stat().st_size else np.zeros(0)
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._stops: list[int] = []
        for start, stop in held[:len(held) // 2 * 2].reshape(-1, 2):
            self._hold(int(start), int(stop))

    def __len__(self) -> int:
        return self.tokens

    def __del__(self) -> None:  # the files stay for the next reader; the descriptors go
        for fd in (getattr(self, "_fd", None), getattr(self, "_log", None)):
            if fd is not None:
                os.close(fd)

    def __getitem__(self, part: slice) -> np.ndarray:
        start, stop, _ = part.indices(self.tokens)
        with self._lock:
            cached = self._covers(start, stop)
        if cached:
            return np.array(self._local[start:stop])
        size = self.dtype.itemsize
        data = self.store.get_range(self.key, start * size, (stop - start) * size)
        os.pwrite(self._fd, data, start * size)
        with self._lock:
            self.bytes_read += len(data)
            os.write(self._log, np.array([start, stop], dtype=self.RECORD).tobytes())
            self._hold(start, stop)
        return np.frombuffer(data, dtype=self.dtype)

    def _covers(self, start: int, stop: int) -> bool:
        at = bisect.bisect_right(self._starts, start) - 1
        return at >= 0 and self._stops[at] >= stop

    def _hold(self, start: int, stop: int) -> None:
        """Note [start, stop) as on disk, merged with the ranges it touches."""
        at = bisect.bisect_right(self._starts, start)
        if at > 0 and self._stops[at - 1] >= start:
            at -= 1
            start = min(start, self._starts[at])
        end = at
        while end < len(self._starts) and self._starts[end] <= stop:
            stop = max(stop, self._stops[end])
            end += 1
        self._starts[at:end], self._stops[at:end] = [start], [stop]


def cache_folder(folder: str, index: dict[str, Any]) -> Path:
    """Where this node keeps a bucket prefix's fetched windows: $RAYTRAIN_DATA_CACHE (default
    ~/.cache/raytrain/data), under a name of the prefix and its index's shard digests, so a
    prefix prepared again is cached afresh."""
    root = Path(os.environ.get("RAYTRAIN_DATA_CACHE", "~/.cache/raytrain/data")).expanduser()
    digest = hashlib.sha256(json.dumps(
        [folder, [(s["file"], s.get("sha256"), s["tokens"]) for s in index["shards"]]]
    ).encode()).hexdigest()[:16]
    return root / digest


class TokenShards:
    def __init__(self, folder: str, seq_len: int, vocab_size: int | None,
                 shuffle: bool = False, seed: int = 0) -> None:
        self.shuffle, self.seed = shuffle, seed
        self.remote = is_remote(folder)
        self.folder = folder if self.remote else Path(folder).expanduser()
        index = read_index(self.folder)
        dtype = np.dtype(index["dtype"])
        self.shards: list[Any]
        if self.remote:
            store = open_store(folder)
            cache = cache_folder(folder, index)
            self.shards = [_BucketShard(store, s["file"], dtype, int(s["tokens"]), cache)
                           for s in index["shards"]]
            self._fetch = ThreadPoolExecutor(8, thread_name_prefix="raytrain-shards")
        else:
            self.shards = [np.memmap(Path(self.folder) / s["file"], dtype=dtype, mode="r")
                           for s in index["shards"]]
        self.starts = list(np.cumsum([0] + [len(s) for s in self.shards]))
        self.total = int(self.starts[-1])
        self.seq_len = seq_len
        self.num_windows = (self.total - 1) // seq_len
        if self.num_windows < 1:
            raise SpecError([FieldError(HERE, f"{self.folder} holds {self.total} tokens, "
                                        f"fewer than seq_len + 1 = {seq_len + 1}. To fix: "
                                        "lower data.seq_len")])
        self.vocab_size = vocab_size
        self.spans = _Spans.load(self, index) if index.get("masked") else None
        if vocab_size is not None and index.get("vocab_size", 0) > vocab_size:
            raise SpecError([FieldError(HERE, f"its tokenizer has {index['vocab_size']} ids, "
                                        f"more than the model's vocab_size {vocab_size}. To "
                                        "fix: prepare the data with the model's tokenizer")])

    def tokens(self, start: int, length: int) -> np.ndarray:
        """`length` tokens of the stream from `start` (across shards where needed)."""
        parts, at = [], start
        while length > 0:
            shard = bisect.bisect_right(self.starts, at) - 1
            offset = at - int(self.starts[shard])
            piece = self.shards[shard][offset:offset + length]
            parts.append(np.asarray(piece, dtype=np.int64))
            at, length = at + len(piece), length - len(piece)
        return np.concatenate(parts)

    def batch(self, indices: Sequence[int]) -> torch.Tensor:
        return self.window_rows(windows(list(indices), self.num_windows, self.shuffle,
                                        self.seed))

    def window_rows(self, chosen: Sequence[int]) -> torch.Tensor:
        """The windows `chosen` (by number), as a batch."""
        import torch

        starts = [int(w) * self.seq_len for w in chosen]
        if self.remote:  # the windows' GETs side by side
            rows = list(self._fetch.map(lambda at: self.tokens(at, self.seq_len + 1), starts))
        else:
            rows = [self.tokens(at, self.seq_len + 1) for at in starts]
        batch = torch.from_numpy(np.stack(rows))
        if self.spans is None:
            return batch
        positions = np.asarray(starts)[:, None] + np.arange(self.seq_len + 1)
        return untrained_marked(batch, torch.from_numpy(self.spans.contains(positions)))

    @property
    def masked(self) -> bool:
        return self.spans is not None

    def trained(self, indices: Sequence[int]) -> int:
        """The trained targets of samples `indices` (each window's last seq_len tokens)."""
        return self.trained_in_windows(windows(list(indices), self.num_windows, self.shuffle,
                                               self.seed))

    def trained_in_windows(self, chosen: Sequence[int]) -> int:
        first = np.asarray(chosen, dtype=np.int64) * self.seq_len + 1
        if self.spans is None:
            return len(first) * self.seq_len
        return int((self.spans.below(first + self.seq_len) - self.spans.below(first)).sum())

    @property
    def bytes_read(self) -> int:
        """From the bucket, so far (0 for a folder)."""
        return sum(getattr(shard, "bytes_read", 0) for shard in self.shards)


class _Spans:
    """The stream's trained token ranges, sorted: [start, end) rows over the whole stream."""

    def __init__(self, spans: np.ndarray) -> None:
        self.starts, self.ends = spans[:, 0], spans[:, 1]
        self.before = np.concatenate([[0], np.cumsum(self.ends - self.starts)])  # trained

    @staticmethod
    def load(shards: TokenShards, index: dict[str, Any]) -> _Spans:
        """Every shard's spans (read whole: a few bytes per example), at its place in the
        stream."""
        parts = [np.zeros((0, 2), dtype=np.int64)]
        store = open_store(str(shards.folder)) if shards.remote else None
        for entry, start in zip(index["shards"], shards.starts):
            name = entry.get("spans")
            if name is None:  # no token of this shard is trained
                continue
            try:
                data = store.get_bytes(name) if store is not None else \
                    (Path(shards.folder) / name).read_bytes()
                if data is None:
                    raise FileNotFoundError(name)
            except (OSError, StoreError) as exc:
                raise SpecError([FieldError(HERE, f"{shards.folder}: the spans of "
                                            f"{entry['file']} cannot be read ({exc}). To fix: "
                                            "prepare and upload the folder whole")]) from None
            parts.append(np.frombuffer(data, dtype=SPANS_DTYPE).reshape(-1, 2) + int(start))
        return _Spans(np.concatenate(parts).astype(np.int64))

    def below(self, positions: np.ndarray) -> np.ndarray:
        """How many trained tokens lie before each of `positions`."""
        if not len(self.starts):
            return np.zeros(np.shape(positions), dtype=np.int64)
        span = np.searchsorted(self.starts, positions, side="right") - 1
        inside = np.clip(positions - self.starts[np.maximum(span, 0)], 0,
                         (self.ends - self.starts)[np.maximum(span, 0)])
        return np.where(span >= 0, self.before[np.maximum(span, 0)] + inside, 0)

    def contains(self, positions: np.ndarray) -> np.ndarray:
        """Whether each of `positions` is trained."""
        if not len(self.starts):
            return np.zeros(np.shape(positions), dtype=bool)
        span = np.searchsorted(self.starts, positions, side="right") - 1
        return (span >= 0) & (positions < self.ends[np.maximum(span, 0)])
