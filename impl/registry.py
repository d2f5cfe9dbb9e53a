"""Registry of replay-buffer variants: a name -> how to build one, and its parameters.

A variant is a structure plus parameters (plus, later, a concurrency policy). Each module in
``impl/variants/`` registers its variants when imported, and so can any installed package
that declares an entry point in the ``replaybench.variants`` group; :func:`names` imports
both on first use. Adding a variant is therefore one file, with no central list to edit.

Public API (stable; used by checks outside the repository)::

    registry.names()                                   # sorted list of names
    buf = registry.create(name, capacity=..., fields={...}, **params)
"""

from __future__ import annotations

import importlib
import numbers
import pkgutil
import warnings
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Callable

from replaybench.registry import Registry

from . import machine
from .storage import parse_schema

__all__ = ["Variant", "ENTRY_POINT_GROUP", "BUFFER_PARAMS", "register", "register_tree", "names", "get", "create",
           "failures"]

ENTRY_POINT_GROUP = "replaybench.variants"

#: Parameters every tree-based variant accepts besides its structure parameters: the sampler's,
#: and three that change speed only (impl.buffers.ReplayBuffer): the storage layout ("columns"
#: or "rows"), transparent huge pages for tree and storage, and the touch (prefetch) passes.
#: Storage and prefetch default to "auto": chosen from the working set (impl.working_set), and
#: recorded in the buffer's ``resolved_params``.
BUFFER_PARAMS = {"alpha": 0.6, "beta": 0.4, "eps": 1e-6, "stratified": False, "seed": None,
                 "storage": "auto", "hugepages": False, "prefetch": "auto"}


@dataclass(frozen=True)
class Variant:
    """A registered variant. ``params`` are the structure parameters and their defaults."""

    name: str
    factory: Callable
    structure: str
    params: dict = field(default_factory=dict)
    description: str = ""
    origin: str = ""
    accepts_any: bool = False  # True when the factory validates its own keyword arguments

    def accepted(self) -> dict:
        return {**self.params, **({} if self.accepts_any else BUFFER_PARAMS)}


_failures: dict[str, str] = {}
_importing: str | None = None  # module that discovery is importing: the origin of what it registers


def register(name: str, factory: Callable, *, structure: str, params: dict | None = None,
             description: str = "", accepts_any: bool = True) -> Variant:
    """Register ``factory(capacity, fields, **params) -> buffer`` under ``name``.

    The buffer must offer ``add``, ``sample``, ``update_priorities``, ``len`` and
    ``capacity`` as PrioritizedReplayBuffer does. Registering a taken name from another
    module is an error; re-importing the same module replaces its own entry.
    """
    origin = _importing or getattr(factory, "__module__", "") or ""
    variant = Variant(name, factory, structure, dict(params or {}), description, origin, accepts_any)
    return _variants.register(name, variant, origin=origin)


def register_tree(name: str, tree_cls, *, structure: str, params: dict | None = None,
                  description: str = "") -> Variant:
    """Register a PrioritizedReplayBuffer over ``tree_cls(capacity, **structure_params)``.

    ``hugepages`` and an explicit ``prefetch`` go to the tree as well when set (a tree class that
    does not take them then refuses them with a TypeError); ``prefetch="auto"`` is resolved by
    the buffer, which then sets the tree's."""
    from .buffers import PrioritizedReplayBuffer
    from .working_set import AUTO, check_prefetch

    def factory(capacity, fields, *, alpha=0.6, beta=0.4, eps=1e-6, stratified=False, seed=None, storage="auto",
                hugepages=False, prefetch="auto", **tree_params):
        check_prefetch(prefetch)  # named, before the tree is built
        _check_room(capacity, fields)
        speed = {k: v for k, v in (("hugepages", hugepages), ("prefetch", prefetch)) if v is not False and v != AUTO}
        tree = tree_cls(capacity, **tree_params, **speed)
        return PrioritizedReplayBuffer(capacity, fields, tree, alpha=alpha, beta=beta, eps=eps,
                                       stratified=stratified, seed=seed, storage=storage, hugepages=hugepages,
                                       prefetch=prefetch)

    factory.__module__ = tree_cls.__module__
    return register(name, factory, structure=structure, params=params, description=description,
                    accepts_any=False)


def _check_room(capacity, fields) -> None:
    """MemoryError (:func:`impl.machine.check_memory`) when even a lower bound of a tree
    buffer's memory, 8 bytes a leaf (float32 sums and mins) plus a transition's bytes a slot,
    exceeds the memory available: before the tree is built and filled (the tree and the
    storage then check their exact sizes). Bad arguments are left to the checks that name
    them."""
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 1:
        return
    try:
        row = sum(spec.nbytes for spec in parse_schema(fields).values())
    except (TypeError, ValueError):
        return
    machine.check_memory(int(capacity) * (8 + row), f"a buffer of capacity={int(capacity)} (at least its tree's "
                                                    f"leaves and {row}-byte transitions)")


def _discover() -> None:
    """Import impl/variants/ and the plug-ins' entry points (once: :class:`Registry` calls it
    on the first lookup)."""
    global _importing
    from . import variants

    modules = [f"{variants.__name__}.{m.name}" for m in pkgutil.iter_modules(variants.__path__)]
    for module in modules:
        _importing = module
        try:
            importlib.import_module(module)
        finally:
            _importing = None
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _importing = ep.value
        try:
            ep.load()
        except Exception as err:  # a broken plug-in must not hide every other variant
            _failures[ep.value] = f"{type(err).__name__}: {err}"
            warnings.warn(f"replaybench: variant plug-in {ep.name} = {ep.value} failed to load: {err}")
        finally:
            _importing = None


_variants: Registry[Variant] = Registry("variant", _discover)


def names() -> list[str]:
    """Sorted names of every registered variant (imports impl/variants and plug-ins once)."""
    return _variants.names()


def get(name: str) -> Variant:
    """The variant called ``name``; :class:`~replaybench.registry.UnknownName` (a KeyError)
    naming the registered ones otherwise."""
    return _variants.get(name)


def create(name: str, capacity: int, fields, **params):
    """Build variant ``name``; ``params`` override its defaults (unknown keys are an error)."""
    variant = get(name)
    if not variant.accepts_any:
        unknown = sorted(set(params) - set(variant.accepted()))
        if unknown:
            raise TypeError(f"variant {name!r} does not take parameter(s) {unknown}; "
                            f"it takes {sorted(variant.accepted())}")
    return variant.factory(capacity, fields, **{**variant.params, **params})


def failures() -> dict[str, str]:
    """Plug-ins that failed to load: entry point value -> error."""
    _variants.names()  # discovery, once
    return dict(_failures)
