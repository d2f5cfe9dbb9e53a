"""One colour per variant (and per policy) in every figure, and the legend labels.

Known names get fixed colours (colour-blind-safe Okabe-Ito and Tableau hues, peers in greys
and browns so our layouts stand out); any other name (a user's variant) gets a colour picked
from a fixed list by a hash of its name (md5, so the same name has the same colour in every
process and on every machine). Policies have a palette of their own, used where lines are
policies rather than variants.
"""

from __future__ import annotations

import hashlib

import pandas as pd

__all__ = ["VARIANT_COLOURS", "POLICY_COLOURS", "variant_colour", "policy_colour", "variant_label", "MARKERS",
           "VARIANT_MARKERS", "marker"]

VARIANT_COLOURS = {
    "binary": "#000000",
    "binary-blocked": "#E69F00",
    "kary": "#56B4E9",
    "kary-aligned": "#0072B2",
    "kary-prefix": "#009E73",
    "uniform": "#CC79A7",
    "peer:cpprb": "#D55E00",
    "peer:torchrl": "#8C564B",
    "peer:tianshou": "#7F7F7F",
}

POLICY_COLOURS = {
    "global-lock": "#000000",
    "pal-locks": "#0072B2",
    "lazy-writing": "#009E73",
    "deferred": "#E69F00",
    "lock-free": "#D55E00",
    "optimistic": "#8C6D31",
    "sharded": "#843C39",
    "atomic-deltas": "#CC79A7",
    "none": "#7F7F7F",
}

#: Colours for names not listed above, chosen by hash (none repeats a listed colour).
_SPARE = ["#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#17BECF", "#BCBD22", "#E377C2",
          "#393B79", "#637939", "#8C6D31", "#843C39", "#7B4173", "#3182BD", "#31A354", "#756BB1"]

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]

#: Markers of the known variants (a second cue beside colour, for print and colour blindness).
VARIANT_MARKERS = {"binary": "o", "binary-blocked": "s", "kary": "v", "kary-aligned": "^", "kary-prefix": "D",
                   "uniform": "x", "peer:cpprb": "P", "peer:torchrl": "X", "peer:tianshou": "*"}


def _hashed(name: str, choices: list) -> str:
    digest = hashlib.md5(str(name).encode()).digest()
    return choices[int.from_bytes(digest[:4], "little") % len(choices)]


def variant_colour(name: str) -> str:
    """The colour of variant ``name`` (fixed for ours and the peers, hashed otherwise)."""
    return VARIANT_COLOURS.get(name) or _hashed(name, _SPARE)


def policy_colour(name: str) -> str:
    """The colour of concurrency policy ``name``."""
    return POLICY_COLOURS.get(name) or _hashed(name, _SPARE)


def marker(name: str) -> str:
    """The marker of variant ``name`` (fixed for ours and the peers, hashed otherwise)."""
    return VARIANT_MARKERS.get(name) or _hashed(name, MARKERS)


def _given(value) -> bool:
    """False for None, NaN, pandas NA and the empty / "none" strings."""
    try:
        if pd.isna(value):
            return False
    except (TypeError, ValueError):
        pass
    return str(value) not in ("", "none")


def variant_label(variant: str, structure=None, K=None, policy=None) -> str:
    """``"kary-aligned (K=16)"``, ``"peer:cpprb (cpprb-segment-tree, K=2)"``: the variant, then its
    structure where it differs from the name, K, and the policy where there is one."""
    extra = []
    if _given(structure) and structure != variant:
        extra.append(str(structure))
    if _given(K):
        extra.append(f"K={int(K)}")
    if _given(policy):
        extra.append(f"policy {policy}")
    return f"{variant} ({', '.join(extra)})" if extra else str(variant)
