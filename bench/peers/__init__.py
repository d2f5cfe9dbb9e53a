"""Peer libraries measured on the same workloads, recorded as variant ``peer:<name>``.

A peer module offers ``NAME``, ``STRUCTURE``, ``PARAMS`` (its defaults, as result columns),
``DESCRIPTION``, ``version()`` (raises when the library cannot be imported) and
``target(capacity, fields, rng) -> bench.workloads.Target``. Peers are optional extras: an
unavailable one is recorded as such, never dropped.
"""

from __future__ import annotations

import importlib

__all__ = ["PEERS", "PREFIX", "is_peer", "load", "availability"]

PREFIX = "peer:"

#: Peer name -> module implementing it.
PEERS = {"cpprb": "bench.peers.cpprb_peer"}


def is_peer(variant: str) -> bool:
    return variant.startswith(PREFIX)


def load(variant: str):
    """The adapter module for ``peer:<name>`` (a KeyError names the known peers)."""
    name = variant[len(PREFIX):] if is_peer(variant) else variant
    if name not in PEERS:
        raise KeyError(f"unknown peer {variant!r}; known: {', '.join(PREFIX + p for p in PEERS)}")
    return importlib.import_module(PEERS[name])


def availability(variant: str) -> tuple[bool, str]:
    """``(True, version)`` when the peer library imports, else ``(False, error message)``."""
    try:
        return True, load(variant).version()
    except Exception as err:  # an optional extra: say why it is missing, do not fail the run
        return False, f"{type(err).__name__}: {err}"
