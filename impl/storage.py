"""Transition storage: every field of every slot in one byte arena, written as a ring.

A schema maps field names to ``(shape, dtype)``; ``{"obs": ((4,), "float32"), "done":
((), "bool")}`` stores ``obs`` as ``(capacity, 4)`` float32 values and ``done`` as
``(capacity,)``. Batches are dicts of arrays with one leading batch axis.

Two layouts of the same arena, told apart only by an address table (``table``, one row
``base, stride, width`` per field, in bytes: slot ``i`` of field ``f`` starts at byte
``base + i * stride`` and is ``width`` bytes long), so the compiled gather and write kernels are
the same for both and a benchmark difference is a difference of addresses:

* :class:`ColumnarStorage` (``"columns"``): one contiguous column per field, each starting on
  a cache line (``stride = width``). A gather touches one line per field per transition.
* :class:`RowStorage` (``"rows"``): one transition's fields packed together (``stride`` = the
  row's size, fields ordered by decreasing item size so each is aligned, the row padded to
  its largest item, and a row that fits in a line to a power of two: :func:`row_stride`). A
  gather touches the one line of a small row, and for large rows (Atari frames) copies one
  contiguous block.

``columns`` gives the usual typed view of each field (strided for rows). ``hugepages=True``
places the arena on transparent huge pages (:func:`impl.trees.layouts.aligned_empty`).

Thread-safety: none; writers and readers are serialised by the buffer or a policy. The
kernels release the GIL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import machine
from .trees.layouts import CACHE_LINE, aligned_empty

__all__ = ["FieldSpec", "Storage", "ColumnarStorage", "RowStorage", "PackedRowStorage", "STORAGE_LAYOUTS",
           "make_storage", "parse_schema", "random_batch", "row_stride", "gather_rows", "touch_rows", "write_rows"]


@dataclass(frozen=True)
class FieldSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Bytes one transition of this field takes."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def size(self) -> int:
        """Items one transition of this field holds."""
        return math.prod(self.shape)


def parse_schema(fields) -> dict[str, FieldSpec]:
    """Validate a ``{name: (shape, dtype)}`` mapping into FieldSpecs, naming what is wrong."""
    if not isinstance(fields, dict) or not fields:
        raise ValueError(f"fields must be a non-empty dict of name -> (shape, dtype), got {fields!r}")
    specs = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"field name must be an identifier string, got {name!r}")
        if name in ("indices", "weights"):
            raise ValueError(f"field name {name!r} is reserved for sample() output")
        try:
            shape, dtype = spec
            shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as err:
            raise ValueError(f"fields[{name!r}] must be (shape, dtype), got {spec!r}: {err}") from None
        if any(s < 0 for s in shape) or dtype.kind not in "biuf":
            raise ValueError(f"fields[{name!r}] = {spec!r}: shape must be non-negative and dtype numeric or bool")
        specs[name] = FieldSpec(name, shape, dtype)
    return specs


_NO_BYTES = np.zeros(0, dtype=np.uint8)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _field_view(arena: np.ndarray, spec: FieldSpec, rows: int, base: int, stride: int) -> np.ndarray:
    """The typed ``(rows, *shape)`` view of one field in a byte arena (no copy)."""
    inner, step = [], spec.dtype.itemsize
    for dim in reversed(spec.shape):  # C order within a row
        inner.insert(0, step)
        step *= dim
    return np.ndarray((rows, *spec.shape), spec.dtype, buffer=arena, offset=base, strides=(stride, *inner))


def _columnar_table(specs: dict[str, FieldSpec], rows: int) -> tuple[np.ndarray, int]:
    """``(table, arena bytes)`` of ``rows`` slots stored column by column, each from a line on."""
    table = np.zeros((len(specs), 3), dtype=np.int64)
    end = 0
    for f, spec in enumerate(specs.values()):
        base = _round_up(end, CACHE_LINE)
        table[f] = (base, spec.nbytes, spec.nbytes)
        end = base + rows * spec.nbytes
    return table, _round_up(max(end, 1), CACHE_LINE)  # a whole number of words: see gather_rows


class Storage:
    """Fixed-capacity byte arena holding every field of ``capacity`` slots (see the module
    docstring). Memory: capacity * row bytes (plus alignment padding)."""

    layout = ""

    def __init__(self, capacity: int, fields, *, hugepages: bool = False):
        self.capacity = int(capacity)
        self.specs = parse_schema(fields)
        self.hugepages = bool(hugepages)
        self._names = frozenset(self.specs)
        self._shapes = {name: s.shape for name, s in self.specs.items()}
        self._flat = [(name, s.dtype, s.size) for name, s in self.specs.items()]  # for as_bytes, per call
        self._plain = [(name, s.dtype, len(s.shape) + 1, s.shape) for name, s in self.specs.items()]  # plain_rows
        self._out_plans: dict[int, tuple] = {}  # batch size -> out_block's table and field cuts
        self.table, nbytes = self._table()
        machine.check_memory(nbytes, f"a {self.layout!r} storage of capacity={self.capacity}")
        self.bind(aligned_empty(nbytes, np.uint8, 0, hugepages=self.hugepages))

    def _table(self) -> tuple[np.ndarray, int]:
        raise NotImplementedError

    @property
    def transition_nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

    def bind(self, arena: np.ndarray) -> None:
        """Use ``arena`` (a 1-D uint8 array of ``arena.size`` bytes, e.g. in shared memory) as the
        storage's state; :attr:`columns` become views of it. Raises ValueError on a mismatch."""
        if not isinstance(arena, np.ndarray) or arena.dtype != np.uint8 or arena.ndim != 1 \
                or (getattr(self, "arena", None) is not None and arena.size != self.arena.size) \
                or not arena.flags.c_contiguous:
            raise ValueError(f"arena must be a contiguous 1-D uint8 array of the storage's size, got {arena!r}")
        self.arena = arena
        self.columns = {name: _field_view(arena, spec, self.capacity, int(self.table[f, 0]), int(self.table[f, 1]))
                        for f, (name, spec) in enumerate(self.specs.items())}

    def check_batch(self, batch) -> tuple[dict[str, np.ndarray], int]:
        """Validate ``batch`` against the schema; return the arrays and the batch length.

        Values are cast to the field dtype when NumPy's ``same_kind`` rule allows it
        (float64 -> float32 yes, float -> int no). Cost: O(1) Python work per field.
        """
        if not isinstance(batch, dict):
            raise TypeError(f"batch must be a dict of field arrays, got {type(batch).__name__}")
        if batch.keys() != self._names:
            missing = sorted(self._names - batch.keys())
            extra = sorted(batch.keys() - self._names)
            raise KeyError(f"batch fields do not match the schema: missing {missing}, unknown {extra}")
        out = {}
        n = None
        for name, value in batch.items():
            arr = value if type(value) is np.ndarray else np.asarray(value)
            shape = self._shapes[name]
            if arr.ndim != len(shape) + 1 or arr.shape[1:] != shape:
                raise ValueError(f"batch[{name!r}] has shape {arr.shape}; expected (n, *{shape})")
            if n is None:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise ValueError(f"batch[{name!r}] has {arr.shape[0]} rows but other fields have {n}")
            dtype = self.specs[name].dtype
            if arr.dtype != dtype and not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise TypeError(f"batch[{name!r}] has dtype {arr.dtype}, which cannot be stored as {dtype}")
            out[name] = arr
        return out, n

    def as_bytes(self, arrays: dict[str, np.ndarray], lo: int, n: int) -> tuple:
        """Rows ``lo .. lo+n-1`` of checked ``arrays`` as the write kernel's input: one
        C-contiguous, writable 1-D uint8 array per field (``n * field bytes``), in schema order
        (cast, copied only when the input is not already such an array; the bytes are a view)."""
        out = []
        for name, dtype, size in self._flat:
            arr = arrays[name]
            if lo or arr.shape[0] != n:
                arr = arr[lo : lo + n]
            if arr.dtype != dtype or not arr.flags.c_contiguous or not arr.flags.writeable:
                # numba types read-only arrays apart: copy those too, to keep one tuple type
                arr = np.array(arr, dtype=dtype, order="C")
            out.append(np.frombuffer(arr, np.uint8) if arr.size else _NO_BYTES)
        return tuple(out)

    def plain_rows(self, batch) -> tuple[tuple, int] | None:
        """``(rows, n)`` for a batch in the form a training loop adds again and again, else None.

        That form: a dict with exactly the schema's fields, each a C-contiguous, writable
        ndarray of the field's dtype and shape with the same ``n >= 1`` rows. For it
        ``rows`` is what :meth:`check_batch` then :meth:`as_bytes` ``(arrays, 0, n)`` return
        (each field's bytes, a view), found in one pass with no cast or copy to consider. None
        sends the caller to those two, which check everything else and raise the errors.
        Cost: O(1) Python work per field."""
        if type(batch) is not dict or len(batch) != len(self._plain):
            return None
        rows = []
        n = -1
        for name, dtype, ndim, shape in self._plain:
            arr = batch.get(name)
            if type(arr) is not np.ndarray or arr.dtype is not dtype or arr.ndim != ndim or arr.shape[1:] != shape:
                return None
            flags = arr.flags
            if not (flags.c_contiguous and flags.writeable) or (n >= 0 and arr.shape[0] != n):
                return None
            n = arr.shape[0]
            rows.append(np.frombuffer(arr, np.uint8) if arr.size else _NO_BYTES)
        return (tuple(rows), n) if n >= 1 else None

    def write(self, start: int, arrays: dict[str, np.ndarray], n: int) -> None:
        """Write ``n`` checked rows at ring slots ``start, start+1, ...`` (wrapping around).

        ``n`` must be <= capacity; the caller keeps only the newest ``capacity`` rows.
        Cost: O(n * row bytes), in one compiled call.
        """
        write_rows(self.arena, self.table, start, self.capacity, self.as_bytes(arrays, 0, n), n)

    def out_block(self, n: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """``(bytes, table, arrays)``: a fresh output block for ``n`` gathered rows, stored column
        by column, its address table, and the typed ``(n, *shape)`` array of each field in it.
        Cost: one allocation and a view per field (``sample`` without ``out=`` pays it per call)."""
        plan = self._out_plans.get(n)
        if plan is None:
            table, nbytes = _columnar_table(self.specs, n)
            cuts = [(name, int(table[f, 0]), int(table[f, 0]) + n * spec.nbytes, spec.dtype, (n, *spec.shape))
                    for f, (name, spec) in enumerate(self.specs.items())]
            plan = self._out_plans[n] = (table, nbytes, cuts)
        table, nbytes, cuts = plan
        # Unfilled (the gather writes every field byte) and not line-aligned: numpy's own
        # alignment (16 bytes) is all the word-wise gather needs, and aligning costs microseconds.
        block = np.empty(nbytes, np.uint8)
        # One ndarray constructor per field: half the cost of slicing, viewing and reshaping.
        return block, table, {name: np.ndarray(shape, dtype, block, lo) for name, lo, _, dtype, shape in cuts}

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the rows at ``indices`` (unchecked). Cost: O(len(indices) * row bytes)."""
        block, table, arrays = self.out_block(indices.shape[0])
        gather_rows(self.arena, self.table, indices, block, table, False)
        return arrays


class ColumnarStorage(Storage):
    """One contiguous column per field, each starting on a cache line (``"columns"``)."""

    layout = "columns"

    def _table(self):
        return _columnar_table(self.specs, self.capacity)


def row_stride(nbytes: int, itemsize: int = 1) -> int:
    """Bytes from one row of :class:`RowStorage` to the next, for rows of ``nbytes`` packed
    bytes whose largest item is ``itemsize`` bytes (a power of two): a row that fits in a cache
    line is padded to the next power of two, so that no row straddles two lines and a gather
    misses one line per row (48-byte CartPole rows, 45 bytes padded to their 8-byte item,
    straddle every other line: 1.5 lines a row; the padding costs up to 2x the memory of such
    rows, 48 -> 64 bytes for CartPole); a longer row is padded to a multiple of ``itemsize`` only (it spans several
    lines anyway, and a rounding to whole lines could nearly double it)."""
    row = max(_round_up(nbytes, itemsize), 1)
    return 1 << (row - 1).bit_length() if row <= CACHE_LINE else row


class RowStorage(Storage):
    """One transition's fields packed into one row (``"rows"``): fields in decreasing item
    size, each at an offset that is a multiple of its item size, the row padded to a multiple
    of the largest item size and, where it fits in a cache line, to a power of two
    (:func:`row_stride`), so every field of every row is aligned and a row lies in one line."""

    layout = "rows"

    def _table(self):
        order = sorted(range(len(self.specs)), key=lambda f: -list(self.specs.values())[f].dtype.itemsize)
        specs = list(self.specs.values())
        table = np.zeros((len(specs), 3), dtype=np.int64)
        offset = 0
        for f in order:
            table[f, 0] = offset
            table[f, 2] = specs[f].nbytes
            offset += specs[f].nbytes
        table[:, 1] = row = self._stride(offset, max(s.dtype.itemsize for s in specs))
        return table, _round_up(row * self.capacity, CACHE_LINE)

    @staticmethod
    def _stride(nbytes: int, itemsize: int) -> int:
        return row_stride(nbytes, itemsize)


class PackedRowStorage(RowStorage):
    """Rows as :class:`RowStorage` lays them out, padded only to their largest item size
    (``"rows-packed"``: CartPole's 45 bytes take 48, so every other row straddles two lines).
    Not a default: it is what the padding to a power of two is measured against (suite
    ``micro-sweep-rows``); it takes less memory where rows are short."""

    layout = "rows-packed"

    @staticmethod
    def _stride(nbytes: int, itemsize: int) -> int:
        return max(_round_up(nbytes, itemsize), 1)


#: Storage layouts by the name the ``storage`` parameter takes.
STORAGE_LAYOUTS = {"columns": ColumnarStorage, "rows": RowStorage, "rows-packed": PackedRowStorage}


def make_storage(layout: str, capacity: int, fields, *, hugepages: bool = False) -> Storage:
    """A storage of ``layout`` (a key of :data:`STORAGE_LAYOUTS`), or ValueError naming it (a
    value of another type too: a list, a tuple or an array is not a layout name)."""
    if not isinstance(layout, str) or layout not in STORAGE_LAYOUTS:
        raise ValueError(f"storage must be one of {sorted(STORAGE_LAYOUTS)}, got {layout!r}")
    if not isinstance(hugepages, (bool, np.bool_)):
        raise ValueError(f"hugepages must be True or False, got {hugepages!r}")
    return STORAGE_LAYOUTS[layout](capacity, fields, hugepages=bool(hugepages))


@njit(nogil=True, cache=True, inline="always")
def _word(bits):
    """The widest word (8, 4, 2 or 1 bytes) that divides every byte offset OR-ed into ``bits``:
    the unit a copy can move without splitting a field (a byte loop is several times slower)."""
    g = 8
    while bits % g:
        g //= 2
    return g


@njit(nogil=True, cache=True, inline="always")
def _gather_field(dst, dbase, dstride, src, sbase, sstride, width, indices):
    """Row ``indices[b]`` (>= 0) of one field to position ``b``; offsets in units of the arrays'
    items. The common widths (1, 2 and 4 words: every field up to 32 bytes) are copied with
    straight-line code, so a row's copy is a few independent loads and stores and the core
    keeps many rows' misses in flight; a copy loop with a runtime trip count per row (what the
    last case runs) costs several times more per row. Offsets are unsigned: numba indexes
    with unsigned integers without the negative-index fix-up it adds to every signed index."""
    dbase, dstride = np.uint64(dbase), np.uint64(dstride)
    sbase, sstride = np.uint64(sbase), np.uint64(sstride)
    one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
    n = indices.shape[0]
    if width == 1:
        for b in range(n):
            dst[dbase + np.uint64(b) * dstride] = src[sbase + np.uint64(indices[b]) * sstride]
    elif width == 2:
        for b in range(n):
            s, d = sbase + np.uint64(indices[b]) * sstride, dbase + np.uint64(b) * dstride
            dst[d] = src[s]
            dst[d + one] = src[s + one]
    elif width == 4:
        for b in range(n):
            s, d = sbase + np.uint64(indices[b]) * sstride, dbase + np.uint64(b) * dstride
            dst[d] = src[s]
            dst[d + one] = src[s + one]
            dst[d + two] = src[s + two]
            dst[d + three] = src[s + three]
    else:
        for b in range(n):
            s, d = sbase + np.uint64(indices[b]) * sstride, dbase + np.uint64(b) * dstride
            for c in range(width):
                dst[d + np.uint64(c)] = src[s + np.uint64(c)]


@njit(nogil=True, cache=True)
def touch_rows(arena, table, indices, size):
    """Load the first and the last byte of every field of the rows at ``indices`` (those in
    ``0 .. size - 1``; others are skipped), so every line a later copy of those rows reads is
    requested (all of them for fields up to a line long; a longer field is a sequential copy,
    which the hardware prefetcher follows): a pass with a short body, so the core has all the
    rows' misses in flight at once (the copy loops' longer bodies would let only a few overlap).
    Returns the bytes' sum, which the caller must use (or the compiler may drop the loads).
    O(n * fields), no store. Field by field over the rows, with the field's offsets read once and
    unsigned (no negative-index fix-up per load): a row-by-row loop over the fields cost
    several times the copy it was to speed up."""
    acc = 0
    n = indices.shape[0]
    usize = np.uint64(size)
    for f in range(table.shape[0]):
        width = np.uint64(table[f, 2])
        if width == 0:
            continue
        base, stride, last = np.uint64(table[f, 0]), np.uint64(table[f, 1]), width - np.uint64(1)
        for b in range(n):
            i = np.uint64(indices[b])  # a negative index wraps past ``size``: skipped as well
            if i < usize:
                first = base + i * stride
                acc += arena[first] + arena[first + last]
    return acc


@njit(nogil=True, cache=True)
def gather_rows(arena, table, indices, out, out_table, touch):
    """Copy the rows at ``indices`` (unchecked) from ``arena`` (address table ``table``) into
    ``out`` (address table ``out_table``, one row per position). ``touch``: first load every
    line of the rows to be copied (:func:`touch_rows`), so their misses overlap. Copies move
    the widest word every offset allows (``arena`` and ``out`` sizes are multiples of 8).
    Returns the touched bytes' sum (so the loads are not optimised away). O(n * row bytes).
    """
    acc = 0
    if touch:
        acc = touch_rows(arena, table, indices, np.int64(1) << 62)
    a8, a4, a2 = arena.view(np.uint64), arena.view(np.uint32), arena.view(np.uint16)
    o8, o4, o2 = out.view(np.uint64), out.view(np.uint32), out.view(np.uint16)
    for f in range(table.shape[0]):
        sb, ss, w = table[f, 0], table[f, 1], table[f, 2]
        db, ds = out_table[f, 0], out_table[f, 1]
        g = _word(sb | ss | w | db | ds)
        if g == 8:
            _gather_field(o8, db // 8, ds // 8, a8, sb // 8, ss // 8, w // 8, indices)
        elif g == 4:
            _gather_field(o4, db // 4, ds // 4, a4, sb // 4, ss // 4, w // 4, indices)
        elif g == 2:
            _gather_field(o2, db // 2, ds // 2, a2, sb // 2, ss // 2, w // 2, indices)
        else:
            _gather_field(out, db, ds, arena, sb, ss, w, indices)
    return acc


@njit(nogil=True, cache=True, inline="always")
def _write_field(dst, base, stride, src, width, start, capacity, n):
    for b in range(n):
        slot = start + b
        if slot >= capacity:
            slot -= capacity
        d = base + slot * stride
        for c in range(width):
            dst[d + c] = src[b * width + c]


@njit(nogil=True, cache=True)
def write_rows(arena, table, start, capacity, rows, n):
    """Write ``n`` rows (``rows``: a tuple with one 1-D uint8 array of ``n * width`` bytes per
    field, as :meth:`Storage.as_bytes` makes) at ring slots ``start, start+1, ...`` wrapping
    at ``capacity``. ``n <= capacity`` (unchecked). O(n * row bytes), in the widest words the
    offsets allow (as :func:`gather_rows`)."""
    a8, a4, a2 = arena.view(np.uint64), arena.view(np.uint32), arena.view(np.uint16)
    for f in range(table.shape[0]):
        src = rows[f]
        base, stride, w = table[f, 0], table[f, 1], table[f, 2]
        if n == 0 or w == 0:
            continue
        g = _word(base | stride | w)
        if g == 8:
            _write_field(a8, base // 8, stride // 8, src.view(np.uint64), w // 8, start, capacity, n)
        elif g == 4:
            _write_field(a4, base // 4, stride // 4, src.view(np.uint32), w // 4, start, capacity, n)
        elif g == 2:
            _write_field(a2, base // 2, stride // 2, src.view(np.uint16), w // 2, start, capacity, n)
        else:
            _write_field(arena, base, stride, src, w, start, capacity, n)


def random_batch(fields: dict, n: int, rng: np.random.Generator, int_high: int = 2) -> dict[str, np.ndarray]:
    """``n`` random transitions matching the schema ``fields`` (checked by :func:`parse_schema`):
    booleans fair coins, integers uniform in ``[0, int_high)``, floats uniform in [0, 1). Input
    for warm-ups, benchmarks and tests; O(n * row size)."""
    out = {}
    for name, spec in parse_schema(fields).items():
        shape = (n, *spec.shape)
        if spec.dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        elif spec.dtype.kind in "iu":
            out[name] = rng.integers(0, int_high, shape).astype(spec.dtype)
        else:
            out[name] = rng.random(shape).astype(spec.dtype)
    return out
