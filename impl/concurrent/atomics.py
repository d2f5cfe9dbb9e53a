"""Atomic read-modify-write on NumPy array elements, for numba kernels and for Python.

numba has no atomics of its own for CPU arrays, so these are LLVM ``atomicrmw`` /
``cmpxchg`` instructions emitted through :func:`numba.extending.intrinsic`. They work on
any array element, including arrays that live in shared memory and are mapped by several
processes: on x86-64 they compile to ``lock xadd`` / ``lock cmpxchg``, which are atomic
across cores and processes alike. Ordering is sequentially consistent.

Use from Python through the small ``@njit`` wrappers (:func:`cas`, :func:`fetch_add`,
:func:`load`); a call costs about 150 ns of dispatch, the instruction itself a few ns.
"""

from __future__ import annotations

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["atomic_add", "atomic_cas", "atomic_load", "cas", "fetch_add", "load"]


def _element_pointer(context, builder, arr_type, arr_value, index_value):
    ary = context.make_array(arr_type)(context, builder, arr_value)
    return cgutils.get_item_pointer(context, builder, arr_type, ary, [index_value], wraparound=False)


@intrinsic
def atomic_add(typingctx, arr, index, value):
    """``old = arr[index]; arr[index] += value`` atomically; returns ``old``.

    Integer arrays use ``atomicrmw add``, float32/float64 arrays ``atomicrmw fadd``.
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
def load(arr, index):
    """Atomic load of ``arr[index]`` (integers)."""
    return atomic_load(arr, index)
