"""The paper figures and targets the figures and the report set beside the measurements.

A suite may carry ``paper`` (the source papers' figures) and ``targets`` (the issues' goals),
each ``{topic: data}`` (bench/suites/*.json); the driver copies both into every run's
meta.json, and :func:`bench.derive.recorded` reads a topic from there. Topics read here:

- ``paper.lf_over_ray`` (lf): ``{"source", "cells": [{"match": {column: value}, "ratio"}]}``;
- ``paper.pal_speedup`` (frameworks): ``{"source", "low", "high"}``;
- ``paper.paac_pong`` (paac): ``{"source", "env_steps_per_s", "setting"}``;
- ``targets.paac_stepping`` (paac): ``{"source", "n_envs", "at_least": {peer: ratio or null}}``;
- ``targets.batched_inference`` (training-throughput): ``{"source", "envs_per_actor",
  "updates_per_step", "at_least"}``;
- ``targets.gossip`` (gossip, gossip-targets): ``{"source", "learners",
  "straggler_at_least_x_allreduce"}``;
- ``targets.training_bounds`` (training-bounds): ``{"source", "bound_fraction_at_least",
  "learner_replay_inrun_over_alone_at_most"}``.

Runs stored before the driver copied them (the reference runs under results/) lack these
topics. For such a run, a topic missing from its meta.json is read from the suite file of the
run's suite name (meta.json ``suite.name``: bench/suites/<name>.json) as that file is now, so
a suite's targets apply to every run of it, also to runs made before they were written down;
this keeps the stored results' figures and analysis/REPORT.md as they were. A run of a suite
since renamed or removed gets nothing from the fallback: the figure or report section then
says :data:`NOT_RECORDED` instead of comparing. Cost: each suite file is read once per process.
"""

from __future__ import annotations

import functools
from typing import Mapping

from replaybench.bench import derive, suites

__all__ = ["NOT_RECORDED", "recorded", "newest"]

#: What a figure or the report says where no run recorded the topic it compares with.
NOT_RECORDED = "no targets recorded"


@functools.lru_cache(maxsize=None)
def _suite_file(name) -> dict:
    """The shipped suite called ``name`` ({} when there is none, e.g. a renamed suite)."""
    if not isinstance(name, str) or name not in suites.available():
        return {}
    return suites.load(name)


def recorded(meta: Mapping | None, kind: str, topic: str):
    """The ``kind`` ("paper" or "targets") data of ``topic`` for the run of ``meta``: its
    meta.json's, else its suite file's (see the module docstring); None when neither has it.

    Raises ValueError naming ``kind`` when it is not one of :data:`bench.derive.RECORDED_KINDS`.
    """
    value = derive.recorded(meta, kind, topic)
    if value is not None:
        return value
    name = ((meta or {}).get("suite") or {}).get("name")
    data = _suite_file(name).get(kind)
    return data.get(topic) if isinstance(data, dict) else None


def newest(metas: Mapping[str, Mapping], kind: str, topic: str, scenario: str | None = None):
    """``(run_id, data)`` of the newest run (by meta.json start time, then run id) of
    ``scenario`` (any, when None) that records ``topic`` (:func:`recorded`); ``(None, None)``
    when none does. For figures and report sections that draw several runs at once."""
    order = sorted(metas, key=lambda r: (str(metas[r].get("start_time") or ""), str(r)), reverse=True)
    for run_id in order:
        meta = metas[run_id]
        if scenario is not None and meta.get("scenario") != scenario:
            continue
        value = recorded(meta, kind, topic)
        if value is not None:
            return run_id, value
    return None, None
