"""Where each node of a sum tree lives: address tables for :mod:`impl.trees.kernels`.

A layout is ``(lay, size)``: the ``(D + 1, 5)`` int64 table of ``base, shift, bshift, mask,
stride`` per depth, and the number of array slots to allocate. Diagrams use K = 2.

Level order, unpadded (``level_order(cap, K, padded=False)``)::

    slot:   0 | 1 2 | 3 4 5 6 | ...        node i's children at i*K+1 .. i*K+K

Level order, padded by K - 1 leading slots (``padded=True``): every sibling group starts at a
multiple of K. With K = 2 this is the classic 1-indexed binary heap; with K = 16 and float32
each group is exactly one 64-byte line (the PAL layout), provided the array itself starts on
a line, which :func:`aligned_empty` guarantees::

    slot:   - | 1 | 2 3 | 4 5 6 7 | ...    (the K-ary generalisation: group j at K*(j+1))

Cache-blocked binary (``blocked(cap)``): depths are cut into groups of four counted up from
the leaves, and each 16-slot block (one 64-byte line at float32) holds one 4-level subtree
as a 1-indexed heap in slots 1..15 (slot 0 unused). A descent touches one block per four
levels, plus, when it turns right at a block boundary, the adjacent line that holds the
sibling block (fetched together by the adjacent-line prefetcher on x86)::

    block:  [ - a | b c | d e f g | h i j k l m n o ]   h..o's children: next group's blocks
"""

from __future__ import annotations

import numpy as np

import mmap

__all__ = ["CACHE_LINE", "HUGE_PAGE", "level_order", "with_leaf_row", "blocked", "aligned_empty", "is_power_of_two"]

CACHE_LINE = 64  # bytes
HUGE_PAGE = 2 << 20  # bytes: an x86-64 transparent huge page
BLOCK_SLOTS = 16  # slots per cache block in the blocked layout
BLOCK_DEPTHS = 4  # binary levels per block: 1 + 2 + 4 + 8 = 15 nodes


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def _depth(capacity: int, K: int) -> int:
    """Smallest D with K**D >= capacity."""
    D, n = 0, 1
    while n < capacity:
        n *= K
        D += 1
    return D


def level_order(capacity: int, K: int, padded: bool) -> tuple[np.ndarray, int]:
    """Address table of a level-order K-ary tree with ``K**D >= capacity`` leaves."""
    D = _depth(capacity, K)
    pad = K - 1 if padded else 0
    lay = np.zeros((D + 1, 5), dtype=np.int64)
    start, width = pad, 1
    for d in range(D + 1):
        lay[d] = (start, 0, 0, 0, 1)
        start += width
        width *= K
    return lay, start


def with_leaf_row(lay: np.ndarray, size: int, K: int) -> tuple[np.ndarray, int]:
    """Append a row saying where raw leaf values live: one slot per leaf (``K**D``, padding
    included) after ``size``, from a cache line on. The prefix-sum layout keeps leaves apart."""
    base = -(-size // 16) * 16
    row = np.array([[base, 0, 0, 0, 1]], dtype=np.int64)
    return np.vstack([lay, row]), base + K ** (lay.shape[0] - 1)


def blocked(capacity: int) -> tuple[np.ndarray, int]:
    """Address table of the cache-blocked binary tree with ``2**H >= capacity`` leaves."""
    H = _depth(capacity, 2)
    # Count groups of four depths up from the leaves so the leaves fill whole blocks; the root
    # block is the one that may be partial. ``offset`` shifts depths so groups start at 0 mod 4.
    offset = (-(H + 1)) % BLOCK_DEPTHS
    lay = np.zeros((H + 1, 5), dtype=np.int64)
    group_start = {}
    blocks = 0
    for d in range(H + 1):
        v = d + offset
        group, r = divmod(v, BLOCK_DEPTHS)
        if group not in group_start:
            group_start[group] = blocks
            blocks += 2**d  # one block per node at the group's top depth
        base = group_start[group] * BLOCK_SLOTS + (1 << r)
        stride = BLOCK_SLOTS if r == 0 else 1
        lay[d] = (base, r, 4, (1 << r) - 1, stride)
    return lay, blocks * BLOCK_SLOTS


def aligned_empty(size: int, dtype, fill, hugepages: bool = False) -> np.ndarray:
    """A 1-D array of ``size`` items whose first item starts on a 64-byte cache line.

    ``hugepages=True`` maps the memory anonymously, starts the array on a 2 MiB boundary and
    asks the kernel for transparent huge pages on it (``madvise(MADV_HUGEPAGE)``), so a random
    descent or gather over a large array misses the TLB far less often (one entry covers 2 MiB
    instead of 4 KiB). It is advice: with THP set to ``never`` (or no MADV_HUGEPAGE on this
    platform) the array is still correct, on small pages. Costs up to 2 MiB of address space.
    """
    dtype = np.dtype(dtype)
    nbytes = size * dtype.itemsize
    if hugepages:
        align = HUGE_PAGE
        # private: an anonymous mmap is shared by default, i.e. shmem, whose huge pages follow
        # shmem_enabled (``never`` on most machines), not the advice given here
        mem = mmap.mmap(-1, nbytes + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            mem.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(mem, dtype=np.uint8)  # keeps the mapping alive through .base
    else:
        align = CACHE_LINE
        raw = np.empty(nbytes + align, dtype=np.uint8)
    skip = (-raw.ctypes.data) % align
    out = raw[skip : skip + size * dtype.itemsize].view(dtype)
    out.fill(fill)
    return out
