"""The speed parameters' ``"auto"`` setting: rows or columns, and the touch passes, chosen from
the working set against the cache sizes this machine reports.

Both parameters change memory traffic only, never a result (tests/test_fused.py), so the choice
can follow the working set:

* ``storage="auto"`` picks ``"rows"`` when the storage (``capacity`` transitions) is larger than
  the core's private cache and a row saves lines: a random gather from columns touches each
  field's own lines (at least one per field), from rows the lines of the packed transition;
  once the arena leaves the private cache each line is a miss. Rows are chosen when they touch
  at most :data:`ROW_LINE_SHARE` of the columns' lines (small transitions of several fields,
  e.g. CartPole's 5 fields in one line against 5). Wide transitions (Atari frames: 885 lines
  either way) save nothing, and the micro-sweep-storage suite measured columns faster for them
  (their inserts copy each field into one contiguous column). When the storage fits, the lines
  hit either way, and columns keep each field contiguous.
* ``prefetch="auto"`` is True when the tree's and the storage's bytes together exceed the
  private cache: a touch pass is a pass of loads that hit when everything is cached (a few
  percent of a call lost), and the way to have all the batch's misses in flight when it is not
  (measured up to 2x at 2**20 leaves, issue 25). The tree touches only its levels larger than
  :data:`impl.trees.array_trees.TOUCH_LEVEL_BYTES`, whatever decides ``prefetch``.

The private cache is the largest per-core data or unified level the machine reports (L2 on
current x86), read once from sysfs (``/sys/devices/system/cpu/cpu0/cache``), else from
``os.sysconf``, else :data:`FALLBACK_PRIVATE_CACHE`. Explicit settings (``"rows"``,
``"columns"``, True, False) are kept as given, so a benchmark can show what each buys; a buffer
records what it ran with in ``resolved_params``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

__all__ = ["AUTO", "FALLBACK_PRIVATE_CACHE", "LINE_BYTES", "ROW_LINE_SHARE", "cache_sizes", "private_cache_bytes", "choose_storage",
           "choose_prefetch", "check_prefetch"]

AUTO = "auto"

#: A cache line's bytes on the x86-64 and arm64 machines this runs on.
LINE_BYTES = 64
#: storage="auto" picks rows when a gathered row touches at most this share of the lines its
#: fields touch as columns (module docstring).
ROW_LINE_SHARE = 0.75
#: Bytes assumed for the private cache when the machine reports none (a common L2 size).
FALLBACK_PRIVATE_CACHE = 1 << 20

_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
_SYSCONF = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE", 3: "SC_LEVEL3_CACHE_SIZE"}
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_size(text: str) -> int:
    """``"32K"`` -> 32768; ``"1024"`` -> 1024; 0 for anything else."""
    text = text.strip().upper()
    scale = _UNITS.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _UNITS else text
    return int(digits) * scale if digits.isdigit() else 0


def _sysfs_sizes(root: Path) -> dict[int, int]:
    sizes = {}
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size > 0:
            sizes[level] = max(size, sizes.get(level, 0))
    return sizes


def _sysconf_sizes() -> dict[int, int]:
    sizes = {}
    for level, name in _SYSCONF.items():
        try:
            size = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if size > 0:
            sizes[level] = int(size)
    return sizes


@functools.cache
def cache_sizes(root: str | None = None) -> dict[int, int]:
    """``{level: bytes}`` of the data/unified caches of CPU 0: from sysfs (``root``, default the
    real one), else ``os.sysconf``, else ``{}``. Read once per process (cached). Cost: a few
    small file reads."""
    return _sysfs_sizes(Path(root) if root else _SYSFS) or _sysconf_sizes()


def private_cache_bytes() -> int:
    """Bytes of the core's private cache: the reported L2 (L1 when no L2 is reported), else
    :data:`FALLBACK_PRIVATE_CACHE`. The line between 'a random access hits' and 'it misses'."""
    sizes = cache_sizes()
    return sizes.get(2) or sizes.get(1) or FALLBACK_PRIVATE_CACHE


def check_prefetch(prefetch) -> bool | str:
    """``prefetch`` as True, False or :data:`AUTO`, or a ValueError naming it."""
    if prefetch == AUTO and isinstance(prefetch, str):
        return AUTO
    if not isinstance(prefetch, (bool, np.bool_)):
        raise ValueError(f"prefetch must be True, False or 'auto', got {prefetch!r}")
    return bool(prefetch)


def choose_storage(storage, capacity: int, field_nbytes: list[int]) -> str:
    """The storage layout to build for ``capacity`` transitions whose fields take
    ``field_nbytes`` bytes each: ``storage`` itself unless it is :data:`AUTO` (see the module
    docstring). Unknown names are passed on for :func:`impl.storage.make_storage` to refuse."""
    if not isinstance(storage, str) or storage != AUTO:  # type first: an array compares elementwise
        return storage
    if capacity * sum(field_nbytes) <= private_cache_bytes():
        return "columns"
    column_lines = sum(max(1, -(-n // LINE_BYTES)) for n in field_nbytes)
    row = sum(field_nbytes)
    # a row that fits in a line is padded to lie in one (impl.storage.row_stride); a longer one
    # may straddle one more line boundary than its length needs
    row_lines = 1 if row <= LINE_BYTES else -(-row // LINE_BYTES) + 1
    return "rows" if row_lines <= ROW_LINE_SHARE * column_lines else "columns"


def choose_prefetch(prefetch, working_set_nbytes: int) -> bool:
    """Whether to run the touch passes: ``prefetch`` itself unless it is :data:`AUTO`, then
    whether ``working_set_nbytes`` (tree plus storage) exceeds the private cache."""
    prefetch = check_prefetch(prefetch)
    if prefetch == AUTO:
        return working_set_nbytes > private_cache_bytes()
    return prefetch
