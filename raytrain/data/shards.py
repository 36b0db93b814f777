"""Token shards: a folder of flat uint16/uint32 token files with an `index.json`, as
`raytrain data prepare` writes them, read as one stream of tokens (the shards in the index's
order, each document followed by the end-of-document token). Sample `i` is the window of
`seq_len + 1` tokens starting at `(i mod n) * seq_len` of that stream, as for a single token
file; a window may span two shards.

The folder may be a bucket's prefix (s3://BUCKET/PREFIX, through the service's storage
settings): then each rank fetches only the windows it trains on, each with one ranged GET,
a batch's windows side by side, and keeps the last ones fetched in memory (an evaluation
reads the same windows every time). The loop's prefetcher reads the next step's batch while
this one trains, so the step does not wait on the bucket.

    source = TokenShards("/data/corpus", seq_len=2048, vocab_size=32000)
    batch = source.batch(range(8))     # int64 [8, 2049]
"""

from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from raytrain.cloud.object_store import Store, is_remote, open_store
from raytrain.core.shuffle import windows
from raytrain.errors import FieldError, SpecError, StoreError

if TYPE_CHECKING:  # torch is imported where a batch is made: admission reads the index only
    import torch

INDEX = "index.json"
HERE = ("data", "path")


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
    """One shard in a bucket, sliced like a memmap: each slice one ranged GET, the last
    CACHED slices kept."""

    CACHED = 4096

    def __init__(self, store: Store, key: str, dtype: np.dtype, tokens: int) -> None:
        self.store, self.key, self.dtype, self.tokens = store, key, dtype, tokens
        self.cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self.bytes_read = 0

    def __len__(self) -> int:
        return self.tokens

    def __getitem__(self, part: slice) -> np.ndarray:
        start, stop, _ = part.indices(self.tokens)
        found = self.cache.get((start, stop))
        if found is not None:
            self.cache.move_to_end((start, stop))
            return found
        size = self.dtype.itemsize
        data = self.store.get_range(self.key, start * size, (stop - start) * size)
        self.bytes_read += len(data)
        tokens = np.frombuffer(data, dtype=self.dtype)
        self.cache[(start, stop)] = tokens
        if len(self.cache) > self.CACHED:
            self.cache.popitem(last=False)
        return tokens


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
            self.shards = [_BucketShard(store, s["file"], dtype, int(s["tokens"]))
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
        return torch.from_numpy(np.stack(rows))

    @property
    def bytes_read(self) -> int:
        """From the bucket, so far (0 for a folder)."""
        return sum(getattr(shard, "bytes_read", 0) for shard in self.shards)
