"""The order a job reads its windows in with `data.shuffle`: a seeded permutation of the n
windows, a new one each epoch, computed per index without storing it (a 4-round Feistel
network over the next even power of two at or above n, cycle-walked into [0, n)), so that
sample `i` is window `shuffled(i mod n, n, seed, i // n)` on any rank count, across resumes
and layout changes, for corpora of any size.

Why not `torch.randperm`: it holds the whole permutation (8 bytes a window: gigabytes for a
large corpus on every rank) and must be drawn again on every resume.

    shuffled(np.arange(10), n=10, seed=0, epoch=0)   # a permutation of 0..9
"""

from __future__ import annotations

import numpy as np

from raytrain.errors import FieldError, SpecError

ROUNDS = 4
_MASK64 = (1 << 64) - 1


def _splitmix(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def shuffled(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """Each of `positions` (in [0, n)) through the epoch's permutation of range(n)."""
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    low = np.uint64((1 << half) - 1)
    keys = [np.uint64(_splitmix((seed << 32) ^ (epoch << 8) ^ r) & 0xFFFFFFFF)
            for r in range(ROUNDS)]

    def feistel(x: np.ndarray) -> np.ndarray:
        for key in keys:
            left, right = x >> np.uint64(half), x & low
            mixed = ((right ^ key) * np.uint64(0x45D9F3B)) & np.uint64(0xFFFFFFFF)
            mixed ^= mixed >> np.uint64(16)
            x = (right << np.uint64(half)) | (left ^ (mixed & low))
        return x

    out = feistel(np.asarray(positions, dtype=np.uint64))
    outside = out >= np.uint64(n)
    while outside.any():  # cycle-walk: a permutation of [0, 2^bits) restricted to [0, n)
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


def windows(indices: object, n: int, shuffle: bool, seed: int) -> np.ndarray:
    """The window each sample index reads: `i mod n` in order, or through its epoch's
    permutation (epoch `i // n`) with `shuffle`."""
    index = np.asarray(indices, dtype=np.int64)
    position, epoch = index % n, index // n
    if not shuffle:
        return position
    out = np.empty_like(position)
    for each in np.unique(epoch):
        chosen = epoch == each
        out[chosen] = shuffled(position[chosen], n, seed, int(each))
    return out


def held_out_windows(total: int, fraction: float) -> int:
    """Of `total` windows (or items), how many `fraction` holds out; SpecError naming the
    fraction when that leaves none to train on."""
    held = max(1, round(total * fraction))
    if total - held < 1:
        raise SpecError([FieldError(("data", "validation", "fraction"), (
            f"holding out {held} of {total} windows leaves none to train on. To fix: lower "
            "the fraction or give more data"))])
    return held
