"""The kernel context: one int64 array that tells a shared buffer's compiled kernels where its
arrays are and what its constants are, built once per buffer object.

Why: numba's dispatcher types and unboxes every argument of a call from Python, about 70-100 ns
an array; the shared kernels once took 22-27 positional arguments (some 1-2 us a call, more
than a 1-row sample's work). Packed here, a call passes the context (one int64 array), the
tree's ``sums`` and ``mins`` (their dtypes and shapes pick the compiled specialisation: float32
or float64, one tree or a sharded stack), the caller's lock token and the call's own arguments.

The calling convention of every shared kernel module (:mod:`impl.concurrent.fused`, and any
policy's own set, :attr:`impl.concurrent.policy.Policy.kernels`)::

    sample(ctx, sums, mins, token, key, beta, octx)                       -> status
    add(ctx, sums, mins, token, values, rows, keep)                        -> (status, first ticket, row)
    update(ctx, sums, mins, token, indices, values, sampled, use_sampled)  -> (status, position, applied)

``octx`` is a second context of the same kind for one :meth:`sample_out` object's output arrays
(:func:`out_context`), also built once.

Layout of ``ctx`` (word offsets are the module's constants; read them in kernels with the
accessors, never by number):

* scalars: :data:`KIND`, :data:`K`, :data:`KSHIFT`, :data:`TOUCH_FROM` (the tree's
  :attr:`~impl.trees.ArraySumTree.kernel_args` scalars), :data:`RESUM_EVERY`, :data:`CAPACITY`,
  :data:`STRATIFIED`, :data:`ROUNDS`, :data:`SAMPLE_PROTOCOL`, :data:`INSERT_PROTOCOL`, :data:`APPLY`
  (the policy's protocol codes, -1 where it has none); and
  :data:`EPS`, :data:`ALPHA`, :data:`VMAX` stored as float64 bits (:func:`f64`);
* arrays, three words each (address, rows, columns): :data:`LAY`, :data:`STATE`, :data:`CTRL`,
  :data:`FCTRL`, :data:`STAMPS`, :data:`WRITERS`, :data:`QUEUE_IDX`, :data:`QUEUE_DELTA`,
  :data:`LOCKSTATS`, :data:`ARENA`, :data:`TABLE`;
* :data:`N_EXTRA` extra slots (:func:`extra`) for what a policy's own kernels need beyond
  these (:meth:`~impl.concurrent.policy.Policy.kernel_extra`, in order): an int takes the
  slot's first word, an array the slot's three.

Safety contract: a context holds raw addresses, so the arrays must outlive every kernel call
that gets it. The words array itself owns a reference to each (:func:`_owning_words`: its
memory is a ctypes buffer that holds them), so a context never outlives its arrays, however a
caller keeps it (an argument tuple from ``kernel_args``, a benchmark loop); shared-memory views
keep their mapping valid until dropped (:mod:`impl.concurrent.shm`), so a stale context reads
a closed buffer's memory, never freed memory. Every array must be C-contiguous with at most two dimensions and of the dtype
its accessor reads (checked when the context is built, by name). Cost in a kernel: one load
per word read, the views made once per call.
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["KernelContext", "out_context", "f64", "extra", "N_EXTRA", "vec_i64", "mat_i64", "vec_f64", "mat_f64",
           "vec_f32", "vec_u8", "vec_bool", "KIND", "K", "KSHIFT", "TOUCH_FROM", "RESUM_EVERY", "CAPACITY",
           "STRATIFIED", "ROUNDS", "SAMPLE_PROTOCOL", "INSERT_PROTOCOL", "APPLY", "EPS", "ALPHA", "VMAX", "LAY", "STATE",
           "CTRL", "FCTRL", "STAMPS", "WRITERS", "QUEUE_IDX", "QUEUE_DELTA", "LOCKSTATS", "ARENA", "TABLE",
           "OUT", "OUT_TABLE", "OUT_INDEX", "OUT_WEIGHT", "OUT_STAMP", "SCRATCH", "SRC_TABLE", "TOUCH_ROWS"]

# scalars of ctx
(KIND, K, KSHIFT, TOUCH_FROM, RESUM_EVERY, CAPACITY, STRATIFIED, ROUNDS, SAMPLE_PROTOCOL, INSERT_PROTOCOL, APPLY,
 EPS, ALPHA, VMAX) = range(14)
_SCALARS = 16
# arrays of ctx: (name, dtype, ndim) in slot order
_ARRAYS = (("lay", np.int64, 2), ("state", np.float64, 0), ("ctrl", np.int64, 0), ("fctrl", np.float64, 0),
           ("stamps", np.int64, 1), ("writers", np.int64, 2), ("queue_idx", np.int64, 1),
           ("queue_delta", np.float64, 1), ("lockstats", np.float64, 1), ("arena", np.uint8, 1),
           ("table", np.int64, 2))
LAY, STATE, CTRL, FCTRL, STAMPS, WRITERS, QUEUE_IDX, QUEUE_DELTA, LOCKSTATS, ARENA, TABLE = (
    _SCALARS + 3 * i for i in range(len(_ARRAYS)))
N_EXTRA = 6
_EXTRA_AT = _SCALARS + 3 * len(_ARRAYS)
_WORDS = _EXTRA_AT + 3 * N_EXTRA

# octx: one sample_out's arrays
_OUT_ARRAYS = (("out", np.uint8, 1), ("out_table", np.int64, 2), ("out_index", np.int64, 1),
               ("out_weight", np.float32, 1), ("out_stamp", np.int64, 1), ("scratch", np.float64, 1),
               ("src_table", np.int64, 2))
OUT, OUT_TABLE, OUT_INDEX, OUT_WEIGHT, OUT_STAMP, SCRATCH, SRC_TABLE = (3 * i for i in range(len(_OUT_ARRAYS)))
TOUCH_ROWS = 3 * len(_OUT_ARRAYS)
_OUT_WORDS = TOUCH_ROWS + 1


@intrinsic
def _as_pointer(typingctx, address):
    """The int64 ``address`` as a ``void*`` (for :func:`numba.carray`)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@njit(nogil=True, cache=True, inline="always")
def vec_i64(ctx, slot):
    """The 1-D int64 array of ``slot`` (a 2-D one flattened)."""
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1] * ctx[slot + 2],), np.int64)


@njit(nogil=True, cache=True, inline="always")
def mat_i64(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1], ctx[slot + 2]), np.int64)


@njit(nogil=True, cache=True, inline="always")
def vec_f64(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1] * ctx[slot + 2],), np.float64)


@njit(nogil=True, cache=True, inline="always")
def mat_f64(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1], ctx[slot + 2]), np.float64)


@njit(nogil=True, cache=True, inline="always")
def vec_f32(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1] * ctx[slot + 2],), np.float32)


@njit(nogil=True, cache=True, inline="always")
def vec_u8(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1] * ctx[slot + 2],), np.uint8)


@njit(nogil=True, cache=True, inline="always")
def vec_bool(ctx, slot):
    return carray(_as_pointer(ctx[slot]), (ctx[slot + 1] * ctx[slot + 2],), np.bool_)


@njit(nogil=True, cache=True, inline="always")
def f64(ctx, slot):
    """The float64 stored (as its bits) in scalar word ``slot``."""
    return ctx[slot:slot + 1].view(np.float64)[0]


@njit(nogil=True, cache=True, inline="always")
def extra(i):
    """The slot of the policy's ``i``-th extra (an int: ``ctx[extra(i)]``; an array: an accessor
    of ``extra(i)``)."""
    return _EXTRA_AT + 3 * i


def _owning_words(n: int, keep: list) -> np.ndarray:
    """``n`` zeroed int64 words as a plain, writable, C-contiguous ndarray (what numba's
    dispatcher types fastest) whose memory object holds ``keep`` alive for as long as the words
    are referenced: numpy keeps the buffer's exporter (a ctypes array, which takes attributes)
    as the array's base."""
    raw = (ctypes.c_int64 * n)()
    raw.keep = keep
    return np.frombuffer(raw, dtype=np.int64)


def _put_array(words: np.ndarray, slot: int, name: str, arr, dtype, ndim: int, keep: list) -> None:
    """Store ``arr``'s address and shape at ``slot``; ``ndim`` 0 accepts 1 or 2 dimensions."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"kernel context array {name!r} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype or not arr.flags.c_contiguous or arr.ndim not in ((1, 2) if ndim == 0 else (ndim,)):
        raise ValueError(f"kernel context array {name!r} must be C-contiguous {np.dtype(dtype)} with "
                         f"{'1 or 2' if ndim == 0 else ndim} dimension(s), got {arr.dtype} shape {arr.shape} "
                         f"(contiguous: {arr.flags.c_contiguous})")
    words[slot] = arr.ctypes.data
    words[slot + 1] = arr.shape[0]
    words[slot + 2] = arr.shape[1] if arr.ndim == 2 else 1
    keep.append(arr)


class KernelContext:
    """A buffer object's kernel context (:attr:`words`, the ``ctx`` argument, which holds every
    array it points to: see the module docstring's safety contract).

    ``tree_args``: the tree's ``kernel_args`` ``(kind, sums, mins, lay, K, kshift, touch_from,
    state)``; ``ring``: the ring's arrays by name (:func:`impl.concurrent.ring.ring_arrays`);
    ``extras``: the policy's :meth:`~impl.concurrent.policy.Policy.kernel_extra` (ints or
    arrays, at most :data:`N_EXTRA`). Raises ValueError naming a bad array or too many extras.
    """

    def __init__(self, tree_args: tuple, ring: dict, lockstats: np.ndarray, storage_arena: np.ndarray,
                 storage_table: np.ndarray, *, resum_every: int, capacity: int, stratified: bool, rounds: int,
                 sample_protocol, insert_protocol, apply_mode, eps: float, alpha: float, vmax: float, extras: tuple = ()):
        kind, self.sums, self.mins, lay, k, kshift, touch_from, state = tree_args
        self._keep: list = []
        words = _owning_words(_WORDS, self._keep)
        floats = words[:_SCALARS].view(np.float64)
        words[KIND], words[K], words[KSHIFT], words[TOUCH_FROM] = kind, k, kshift, touch_from
        words[RESUM_EVERY], words[CAPACITY], words[STRATIFIED], words[ROUNDS] = resum_every, capacity, stratified, rounds
        words[SAMPLE_PROTOCOL] = -1 if sample_protocol is None else sample_protocol
        words[INSERT_PROTOCOL] = -1 if insert_protocol is None else insert_protocol
        words[APPLY] = -1 if apply_mode is None else apply_mode
        floats[EPS], floats[ALPHA], floats[VMAX] = eps, alpha, vmax
        given = {"lay": lay, "state": state, "lockstats": lockstats, "arena": storage_arena, "table": storage_table,
                 **ring}
        for i, (name, dtype, ndim) in enumerate(_ARRAYS):
            _put_array(words, _SCALARS + 3 * i, name, given[name], dtype, ndim, self._keep)
        if len(extras) > N_EXTRA:
            raise ValueError(f"kernel_extra must give at most {N_EXTRA} items, got {len(extras)}")
        for i, item in enumerate(extras):
            slot = _EXTRA_AT + 3 * i
            if isinstance(item, np.ndarray):
                if not item.flags.c_contiguous or item.ndim not in (1, 2):
                    raise ValueError(f"kernel_extra item {i} must be a C-contiguous 1-D or 2-D array, got shape "
                                     f"{item.shape}")
                words[slot], words[slot + 1] = item.ctypes.data, item.shape[0]
                words[slot + 2] = item.shape[1] if item.ndim == 2 else 1
                self._keep.append(item)
            elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
                words[slot] = int(item)
            else:
                raise ValueError(f"kernel_extra item {i} must be an int or a numpy array, got {item!r}")
        self.words = words


@njit(nogil=True, cache=True)
def _out_words(words, out, out_table, out_index, out_weight, out_stamp, scratch, src_table, touch_rows):
    """The addresses and shapes of one sample_out's arrays into ``words`` (compiled: a Python
    read of an array's address costs about 1.4 us, and ``sample`` without ``out=`` builds one)."""
    words[OUT], words[OUT + 1], words[OUT + 2] = out.ctypes.data, out.shape[0], 1
    words[OUT_TABLE], words[OUT_TABLE + 1], words[OUT_TABLE + 2] = (out_table.ctypes.data, out_table.shape[0],
                                                                     out_table.shape[1])
    words[OUT_INDEX], words[OUT_INDEX + 1], words[OUT_INDEX + 2] = out_index.ctypes.data, out_index.shape[0], 1
    words[OUT_WEIGHT], words[OUT_WEIGHT + 1], words[OUT_WEIGHT + 2] = out_weight.ctypes.data, out_weight.shape[0], 1
    words[OUT_STAMP], words[OUT_STAMP + 1], words[OUT_STAMP + 2] = out_stamp.ctypes.data, out_stamp.shape[0], 1
    words[SCRATCH], words[SCRATCH + 1], words[SCRATCH + 2] = scratch.ctypes.data, scratch.shape[0], 1
    words[SRC_TABLE], words[SRC_TABLE + 1], words[SRC_TABLE + 2] = (src_table.ctypes.data, src_table.shape[0],
                                                                     src_table.shape[1])
    words[TOUCH_ROWS] = touch_rows


def out_context(out: np.ndarray, out_table: np.ndarray, out_index: np.ndarray, out_weight: np.ndarray,
                out_stamp: np.ndarray, scratch: np.ndarray, src_table: np.ndarray, touch_rows: bool) -> np.ndarray:
    """``octx`` for one sample_out object's arrays (it holds them alive, as a context does).
    ValueError naming a bad array. Cost: about 3 us (checks and one compiled call)."""
    given = (out, out_table, out_index, out_weight, out_stamp, scratch, src_table)
    for (name, dtype, ndim), arr in zip(_OUT_ARRAYS, given):
        if type(arr) is not np.ndarray or arr.dtype != dtype or arr.ndim != ndim or not arr.flags.c_contiguous:
            raise ValueError(f"output context array {name!r} must be a C-contiguous {np.dtype(dtype)} ndarray with "
                             f"{ndim} dimension(s), got {getattr(arr, 'dtype', type(arr).__name__)} "
                             f"shape {getattr(arr, 'shape', None)}")
    words = _owning_words(_OUT_WORDS, list(given))
    _out_words(words, *given, int(bool(touch_rows)))
    return words
