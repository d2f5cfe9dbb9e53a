"""Columnar transition storage: one preallocated array per field, written as a ring.

A schema maps field names to ``(shape, dtype)``; ``{"obs": ((4,), "float32"), "done":
((), "bool")}`` stores ``obs`` as a ``(capacity, 4)`` float32 array and ``done`` as
``(capacity,)``. Batches are dicts of arrays with one leading batch axis.

Thread-safety: none; writers and readers are serialised by the buffer or a policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FieldSpec", "ColumnarStorage", "parse_schema", "random_batch"]


@dataclass(frozen=True)
class FieldSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Bytes one transition of this field takes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


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


class ColumnarStorage:
    """Fixed-capacity arrays, one per field. Memory: capacity * sum(field bytes)."""

    def __init__(self, capacity: int, fields):
        self.capacity = int(capacity)
        self.specs = parse_schema(fields)
        self.columns = {name: np.zeros((self.capacity, *s.shape), dtype=s.dtype) for name, s in self.specs.items()}
        self._names = frozenset(self.specs)
        self._shapes = {name: s.shape for name, s in self.specs.items()}

    @property
    def transition_nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs.values())

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

    def write(self, start: int, arrays: dict[str, np.ndarray], n: int) -> None:
        """Write ``n`` checked rows at ring slots ``start, start+1, ...`` (wrapping around).

        ``n`` must be <= capacity; the caller keeps only the newest ``capacity`` rows.
        """
        first = min(n, self.capacity - start)
        columns = self.columns
        if first == n:  # no wrap-around: one slice assignment per field (the hot path)
            end = start + n
            for name, arr in arrays.items():
                columns[name][start:end] = arr
            return
        for name, arr in arrays.items():
            col = columns[name]
            col[start : start + first] = arr[:first]
            col[: n - first] = arr[first:n]

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the rows at ``indices`` (unchecked). Cost: O(len(indices) * row bytes)."""
        return {name: col.take(indices, axis=0) for name, col in self.columns.items()}


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
