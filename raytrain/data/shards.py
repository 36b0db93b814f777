"""Token shards: a folder of flat uint16/uint32 token files with an `index.json`, as
`raytrain data prepare` writes them, read as one stream of tokens (the shards in the index's
order, each document followed by the end-of-document token). Sample `i` is the window of
`seq_len + 1` tokens starting at `(i mod n) * seq_len` of that stream, as for a single token
file; a window may span two shards.

    source = TokenShards("/data/corpus", seq_len=2048, vocab_size=32000)
    batch = source.batch(range(8))     # int64 [8, 2049]
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from raytrain.core.shuffle import windows
from raytrain.errors import FieldError, SpecError

INDEX = "index.json"
HERE = ("data", "path")


def read_index(folder: Path) -> dict[str, Any]:
    """The folder's index; SpecError naming data.path when there is none or it is broken."""
    try:
        index = json.loads((folder / INDEX).read_text())
        assert index["dtype"] in ("uint16", "uint32") and index["shards"]
    except (OSError, ValueError, KeyError, AssertionError, TypeError) as exc:
        raise SpecError([FieldError(HERE, f"{folder} holds no readable {INDEX} ({exc}). To "
                                    "fix: give a folder `raytrain data prepare` wrote, or a "
                                    "single token file")]) from None
    return dict(index)


class TokenShards:
    def __init__(self, folder: str, seq_len: int, vocab_size: int | None,
                 shuffle: bool = False, seed: int = 0) -> None:
        self.shuffle, self.seed = shuffle, seed
        self.folder = Path(folder).expanduser()
        index = read_index(self.folder)
        dtype = np.dtype(index["dtype"])
        self.shards = [np.memmap(self.folder / s["file"], dtype=dtype, mode="r")
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
        rows = [self.tokens(int(w) * self.seq_len, self.seq_len + 1) for w in chosen]
        return torch.from_numpy(np.stack(rows))
