"""Peer libraries measured on the same workloads, recorded as variant ``peer:<name>``.

A peer module offers ``NAME``, ``STRUCTURE``, ``PARAMS`` (its defaults, as result columns),
``DESCRIPTION``, ``version()`` (raises when the library cannot be imported) and
``target(capacity, fields, rng) -> bench.workloads.Target``, and optionally ``MAX_CAPACITY``
(with ``MAX_CAPACITY_REASON``) when filling larger buffers would take too long: grid cells
above it are recorded as ``skipped``, and ``FORK_AFTER_USE = False`` when the library
cannot be used in a process that is then forked (torch: its thread pools and locks do not
survive a fork once an op has run; the micro workers are forked from a manager that has only
imported such a library, see :mod:`bench.pyperf_worker`). Peers are optional extras (``pip install -e .[peers]``):
an unavailable one is recorded as such with its import error, never dropped. A peer has fixed
parameters (``PARAMS``); a grid parameter that differs from them is ``skipped`` for it.
"""

from __future__ import annotations

import importlib

from replaybench.registry import Registry

__all__ = ["PEERS", "PREFIX", "is_peer", "load", "availability", "skip_reason", "fork_after_use"]

PREFIX = "peer:"

#: Peer name -> the module implementing it (imported when the peer is first used).
PEERS: Registry[str] = Registry("peer")
for _name in ("cpprb", "tianshou", "torchrl"):
    PEERS.register(_name, f"replaybench.bench.peers.{_name}_peer", origin=__name__)


def is_peer(variant: str) -> bool:
    return variant.startswith(PREFIX)


def load(variant: str):
    """The adapter module for ``peer:<name>`` (:class:`~replaybench.registry.UnknownName`, a
    KeyError, names the known peers)."""
    name = variant[len(PREFIX):] if is_peer(variant) else variant
    return importlib.import_module(PEERS.get(name))


def availability(variant: str) -> tuple[bool, str]:
    """``(True, version)`` when the peer library imports, else ``(False, error message)``."""
    try:
        return True, load(variant).version()
    except Exception as err:  # an optional extra: say why it is missing, do not fail the run
        return False, f"{type(err).__name__}: {err}"


def skip_reason(variant: str, capacity: int | None, params: dict) -> str:
    """Why peer ``variant`` cannot run this grid cell, or "" when it can."""
    mod = load(variant)
    limit = getattr(mod, "MAX_CAPACITY", None)
    if limit is not None and capacity is not None and capacity > limit:
        return getattr(mod, "MAX_CAPACITY_REASON", f"{variant} runs capacities up to {limit} only")
    for key, value in params.items():
        if key not in mod.PARAMS:
            return f"{variant} does not take parameter {key!r} (its parameters are fixed: {mod.PARAMS})"
        if mod.PARAMS[key] != value:
            return f"{variant} has fixed {key}={mod.PARAMS[key]!r}, not {value!r}"
    return ""


def fork_after_use(variant: str) -> bool:
    """Whether a process may fork after using peer ``variant`` (False: import it only, then fork)."""
    return getattr(load(variant), "FORK_AFTER_USE", True)
