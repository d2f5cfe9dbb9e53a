"""Atomic read-modify-write on NumPy array elements, for numba kernels and for Python.

numba has no atomics of its own for CPU arrays, so these are LLVM ``atomicrmw`` /
``cmpxchg`` instructions emitted through :func:`numba.extending.intrinsic`. They work on
any array element, including arrays that live in shared memory and are mapped by several
processes: on x86-64 they compile to ``lock xadd`` / ``lock cmpxchg``, which are atomic
across cores and processes alike. Ordering is sequentially consistent.

Use from Python through the small ``@njit`` wrappers (:func:`cas`, :func:`fetch_add`,
:func:`load`); a call costs about 150 ns of dispatch, the instruction itself a few ns.

What lock code inside kernels needs besides (:mod:`impl.concurrent.fused`): :func:`atomic_read`
(an acquire load that does not write the line, to poll a lock word), :func:`cpu_relax`, the
spin-wait hint (x86 ``pause``: lets the sibling hyperthread run and avoids the memory-order
flush when the lock word changes), :func:`acquire_fence` (a seqlock reader's barrier: the loads
before it complete before the loads after it), :func:`full_fence` (a store, then a load of another
word: the reader-writer lock's handshake), :func:`yield_core` (``sched_yield``: lets a lock holder
that shares this core run; 0.3-1 us when nothing else is runnable), :func:`monotonic`,
``clock_gettime(CLOCK_MONOTONIC)`` (the clock of Python's ``time.perf_counter`` on Linux,
so times measured in a kernel and in Python add up; 30-150 ns a read, vDSO), and
:func:`process_gone`, whether a lock holder's process has died (``kill(pid, 0)``, then
``waitid`` for an exited child: a system call or two, for the rare checks that need it).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["atomic_add", "atomic_cas", "atomic_load", "atomic_xchg", "cas", "fetch_add", "load", "exchange",
           "atomic_read", "acquire_fence", "full_fence", "first_nonzero", "cpu_relax", "monotonic", "yield_core",
           "prefetch_write", "process_gone"]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_CLOCK_MONOTONIC = 1  # Linux's clock id
# Linked by symbol name (not a ctypes pointer), so the kernels that read the clock stay cacheable.
_clock_gettime = types.ExternalFunction("clock_gettime", types.int32(types.int32, types.voidptr))
_sched_yield = types.ExternalFunction("sched_yield", types.int32())
_kill = types.ExternalFunction("kill", types.int32(types.int32, types.int32))
_waitid = types.ExternalFunction("waitid", types.int32(types.int32, types.int32, types.voidptr, types.int32))
_P_PID, _WEXITED, _WNOHANG, _WNOWAIT = 1, 4, 1, 0x01000000  # Linux's values
# siginfo_t's si_pid, in int32 words: after si_signo, si_errno, si_code and, on 64-bit Linux, the
# padding that aligns the union it starts (offset 16 bytes on x86-64 and aarch64 alike).
_SI_PID = 4


def _element_pointer(context, builder, arr_type, arr_value, index_value):
    ary = context.make_array(arr_type)(context, builder, arr_value)
    return cgutils.get_item_pointer(context, builder, arr_type, ary, [index_value], wraparound=False)


@intrinsic
def atomic_add(typingctx, arr, index, value):
    """``old = arr[index]; arr[index] += value`` atomically; returns ``old``.

    Integer arrays use ``atomicrmw add``, float32/float64 arrays ``atomicrmw fadd`` (on x86-64 a
    ``lock cmpxchg`` loop that LLVM emits: the add is rounded once, as ``+=`` would round it, and
    no add is lost between threads or between processes that map the same memory; a sum of
    exactly representable values whose partial sums are exact, such as small multiples of a
    power of 2, is therefore exact: tests/test_concurrency_atomic.py checks it across processes).
    """
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(index, types.Integer):
        return None
    dtype = arr.dtype

    def codegen(context, builder, signature, args):
        arr_value, index_value, value_value = args
        ptr = _element_pointer(context, builder, signature.args[0], arr_value, index_value)
        val = context.cast(builder, value_value, signature.args[2], dtype)
        op = "fadd" if isinstance(dtype, types.Float) else "add"
        return builder.atomic_rmw(op, ptr, val, "seq_cst")

    return dtype(arr, index, value), codegen


@intrinsic
def atomic_cas(typingctx, arr, index, expected, new):
    """If ``arr[index] == expected`` set it to ``new``; returns the value seen (integers only)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(arr.dtype, types.Integer):
        return None
    dtype = arr.dtype

    def codegen(context, builder, signature, args):
        arr_value, index_value, exp_value, new_value = args
        ptr = _element_pointer(context, builder, signature.args[0], arr_value, index_value)
        exp = context.cast(builder, exp_value, signature.args[2], dtype)
        new = context.cast(builder, new_value, signature.args[3], dtype)
        pair = builder.cmpxchg(ptr, exp, new, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return dtype(arr, index, expected, new), codegen


@intrinsic
def atomic_xchg(typingctx, arr, index, value):
    """``old = arr[index]; arr[index] = value`` atomically (``atomicrmw xchg``); returns ``old``.

    Any integer or float array: a float element is exchanged as the integer of its width (the
    same bits), so it works on every LLVM version. Two writers that exchange the same word see
    a chain of values, each taking the one the other left: ``new - old`` summed over all the
    exchanges of a word is exactly its last value minus its first (a leaf's deltas add up)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(index, types.Integer):
        return None
    dtype = arr.dtype
    if not isinstance(dtype, (types.Integer, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        arr_value, index_value, value_value = args
        ptr = _element_pointer(context, builder, signature.args[0], arr_value, index_value)
        val = context.cast(builder, value_value, signature.args[2], dtype)
        if isinstance(dtype, types.Float):
            word = ir.IntType(dtype.bitwidth)
            old = builder.atomic_rmw("xchg", builder.bitcast(ptr, word.as_pointer()), builder.bitcast(val, word),
                                     "seq_cst")
            return builder.bitcast(old, context.get_value_type(dtype))
        return builder.atomic_rmw("xchg", ptr, val, "seq_cst")

    return dtype(arr, index, value), codegen


@intrinsic
def atomic_load(typingctx, arr, index):
    """``arr[index]`` read with an atomic (sequentially consistent) load (integers only)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(arr.dtype, types.Integer):
        return None
    dtype = arr.dtype

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        # an atomic add of 0 is a full-barrier load on every architecture LLVM targets
        return builder.atomic_rmw("add", ptr, context.get_constant(dtype, 0), "seq_cst")

    return dtype(arr, index), codegen


@njit(nogil=True, cache=True)
def cas(arr, index, expected, new):
    """Compare-and-swap ``arr[index]``: returns the value seen (== expected on success)."""
    return atomic_cas(arr, index, expected, new)


@njit(nogil=True, cache=True)
def fetch_add(arr, index, value):
    """Atomically add ``value`` to ``arr[index]``; returns the value before."""
    return atomic_add(arr, index, value)


@njit(nogil=True, cache=True)
def exchange(arr, index, value):
    """Atomically store ``value`` in ``arr[index]``; returns the value before."""
    return atomic_xchg(arr, index, value)


@njit(nogil=True, cache=True)
def load(arr, index):
    """Atomic load of ``arr[index]`` (integers)."""
    return atomic_load(arr, index)


@intrinsic
def cpu_relax(typingctx):
    """Spin-wait hint: x86 ``pause`` (nothing elsewhere)."""

    def codegen(context, builder, signature, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def prefetch_write(typingctx, arr, index):
    """Ask for ``arr[index]``'s line in the state a write needs (``llvm.prefetch``, write intent,
    high locality; x86 ``prefetchw``): a hint, no load. Kernels issue one per item before a
    loop of locked instructions, which would otherwise take their misses one at a time (a
    locked instruction waits for every load before it, so no later miss starts early);
    prefetches are not held back that way. Does nothing to the value, never faults."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(arr, index), codegen


@intrinsic
def atomic_read(typingctx, arr, index):
    """``arr[index]`` read with an acquire load (integers only): unlike :func:`atomic_load` it
    does not write the line, so a spin loop that polls a lock word with it leaves the word's
    cache line shared, and the compiler re-reads it every iteration."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(arr.dtype, types.Integer):
        return None
    dtype = arr.dtype

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", dtype.bitwidth // 8)

    return dtype(arr, index), codegen


@intrinsic
def acquire_fence(typingctx):
    """An acquire fence: no load after it is performed (by the compiler or the core) before
    the loads ahead of it. A seqlock reader puts one between its copy and the re-read of the
    stamps, so the re-read cannot be moved ahead of the copy it vouches for. On x86-64 this
    emits no instruction (loads are not reordered with loads); it stops the compiler."""

    def codegen(context, builder, signature, args):
        builder.fence("acquire")
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def full_fence(typingctx):
    """A sequentially consistent fence: every store and load before it is globally visible
    before any load after it. The reader-writer handshake needs it (a reader announces itself
    in its slot, then reads the writer's word; a writer takes its word, then reads the
    slots): without it a load may pass the store ahead of it, and the two would miss each
    other. On x86-64 ``mfence`` (tens of cycles)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.none(), codegen


@njit(nogil=True, cache=True)
def first_nonzero(arr, start, stop):
    """After a full fence, the first ``i`` in ``start .. stop - 1`` whose ``arr[i]`` (integers,
    each read with an acquire load) is not 0, else -1: a writer's scan of the reader words
    after taking a lock word (see :func:`full_fence`). One call, O(stop - start)."""
    full_fence()
    for i in range(start, stop):
        if atomic_read(arr, i) != 0:
            return i
    return -1


@njit(nogil=True, cache=True, inline="always")
def monotonic(ts):
    """Seconds on the monotonic clock (as ``time.perf_counter`` on Linux); ``ts``: a 2-element
    int64 scratch array the call fills with (seconds, nanoseconds)."""
    _clock_gettime(_CLOCK_MONOTONIC, ts.ctypes)
    return ts[0] + ts[1] * 1e-9


@njit(nogil=True, cache=True, inline="always")
def yield_core():
    """``sched_yield()``: give the core to another runnable thread or process, if any."""
    _sched_yield()


@njit(nogil=True, cache=True)
def process_gone(pid):
    """Whether process ``pid`` has died, as far as a kernel can tell with a system call or two:
    ``kill(pid, 0)`` fails (no such process; also a live process this user may not signal,
    which a caller's slow path, :func:`impl.concurrent.locks.pid_alive`, tells apart), or
    ``pid`` is a child of this process that has exited and is not yet reaped (a zombie, which
    ``kill`` still finds: ``waitid(P_PID, pid, WEXITED | WNOHANG | WNOWAIT)`` reports it and
    leaves it to its reaper). A zombie of another parent counts as alive here until that
    parent reaps it (``pid_alive`` reads /proc for it). About 0.5-1 us."""
    if _kill(np.int32(pid), np.int32(0)) != 0:
        return True
    info = np.zeros(32, dtype=np.int32)  # one siginfo_t (128 bytes); si_pid stays 0 unless a child is reported
    if _waitid(np.int32(_P_PID), np.int32(pid), info.ctypes, np.int32(_WEXITED | _WNOHANG | _WNOWAIT)) != 0:
        return False  # ECHILD: not a child of this process, and alive
    return info[_SI_PID] == pid
