"""Row selection and labels shared by the training figures (scenario ``training``)."""

from __future__ import annotations

import pandas as pd

from replaybench.analysis import load
from replaybench.bench import contract

__all__ = ["training_rows", "task_label", "several_buffers", "is_baseline", "buffer_label", "learner_label",
           "config_label", "CONFIG",
           "WORKER_COLOURS", "worker_colour"]

#: What one training configuration is (seeds are its repeats).
CONFIG = ["run_id", "task", "variant", "K", "policy", "algo", "env", "engine", "device", "settings", "actors",
          "learners", "updates_per_step", "envs_per_actor"]

#: What makes two runs' rows the same measurement (params, which hold run lengths and roles, are
#: left out so that the newest run of a configuration and seed replaces older ones whole; so is the
#: metric, so that a newer run without one of them, such as a speedup where it had no sequential
#: loop, leaves it out instead of keeping an older run's beside its own rates).
CELL = ["scenario", "op", "variant", "K", "policy", "algo", "env", "engine", "device", "settings", "actors",
        "learners", "seed", "updates_per_step", "envs_per_actor"]

#: Colours by number of learners (1, 2, 4, 8 ...); the sequential baseline is black.
WORKER_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7F7F7F"]


def several_buffers(rows: pd.DataFrame) -> bool:
    """Whether the parallel (non-baseline) rows hold more than one variant, K or policy."""
    parallel = rows[~rows["baseline"]]
    return any(parallel[c].astype(str).nunique() > 1 for c in ("variant", "K", "policy"))


def training_rows(table: pd.DataFrame, op: str) -> pd.DataFrame:
    """Rows of scenario ``training`` and ``op`` ("episode", "summary", "profile"), with
    ``baseline`` (True for the sequential run) added.

    Where several runs (of any suite) trained the same configuration and seed, only the newest
    run's rows are kept: its return curve, summaries and per-role profiles together.
    """
    rows = table[(table["scenario"] == "training") & (table["op"] == op)]
    # the ratio of gradient updates to env steps is a grid parameter (params.updates_per_step):
    # runs at different ratios are different configurations, never one another's repeats
    rows = rows.assign(updates_per_step=[contract.params_of(p).get("updates_per_step") for p in rows["params"]])
    # so is the number of environments per actor (params.envs_per_actor; runs before it existed: 1)
    rows = rows.assign(envs_per_actor=[contract.params_of(p).get("envs_per_actor", 1) for p in rows["params"]])
    # and so are the learners' device and settings (a CUDA learner's rates are no repeat of a CPU one's)
    rows = rows.assign(device=[contract.training_device(p) for p in rows["params"]],
                       settings=[contract.training_settings(p) for p in rows["params"]])
    rows = load.latest_per_cell(rows, CELL)
    rows = rows.assign(task=[task_label(a, e, r, n) for a, e, r, n in zip(rows["algo"], rows["env"],
                                                                         rows["updates_per_step"], rows["envs_per_actor"])])
    return rows.assign(baseline=[is_baseline(r) for _, r in rows.iterrows()])


def task_label(algo, env, ratio, envs_per_actor=1) -> str:
    """What one row of panels shows: ``"dqn on CartPole-v1, 0.5 updates/step"`` (``", 16 envs/actor"``
    added when E > 1). Runs at different updates-per-step ratios or numbers of environments per
    actor are different tasks (each has its own sequential baseline)."""
    text = f"{algo or '?'} on {env or '?'}"
    if ratio is not None and not pd.isna(ratio):
        text += f", {float(ratio):g} updates/step"
    return text if envs_per_actor in (None, 1) or pd.isna(envs_per_actor) else f"{text}, {int(envs_per_actor)} envs/actor"


def is_baseline(row) -> bool:
    """The sequential baseline: params say ``"baseline": true``, or actors = learners = 0."""
    if contract.params_of(row.get("params")).get("baseline"):
        return True
    return (pd.isna(row.get("actors")) or row.get("actors") == 0) and (pd.isna(row.get("learners"))
                                                                       or row.get("learners") == 0)


def _count(value) -> int:
    return 0 if pd.isna(value) else int(value)


def buffer_label(row, show_variant: bool = True) -> str:
    """``"kary-aligned K=16, pal-locks"``: the variant and K (when ``show_variant``) and the policy
    (when there is one)."""
    what = []
    if show_variant:
        what.append(str(row["variant"]) + ("" if pd.isna(row.get("K")) else f" K={int(row['K'])}"))
    if isinstance(row.get("policy"), str) and row["policy"] not in ("", "none"):
        what.append(str(row["policy"]))
    return ", ".join(what)


def learner_label(row) -> str:
    """The learners' device and settings where they are not the defaults (``"cuda, lag=1"``;
    ``""`` for a CPU learner with none)."""
    device, settings = row.get("device"), row.get("settings")
    what = [str(device)] if isinstance(device, str) and device != "cpu" else []
    what += [settings] if isinstance(settings, str) and settings not in ("", "-") else []
    return ", ".join(what)


def config_label(row, show_variant: bool = True) -> str:
    """``"4 actors, 1 learner (kary-aligned K=16, pal-locks)"`` or ``"sequential (kary-aligned K=16)"``
    (and the learners' device and settings where not the defaults: :func:`learner_label`)."""
    what = ", ".join(x for x in (buffer_label(row, show_variant), learner_label(row)) if x)
    suffix = f" ({what})" if what else ""
    if row.get("baseline"):
        return "sequential" + suffix
    a, l_ = _count(row["actors"]), _count(row["learners"])
    return f"{a} actor{'s' * (a != 1)}, {l_} learner{'s' * (l_ != 1)}" + suffix



def worker_colour(learners, baseline: bool) -> str:
    """Black for the baseline, else a colour per number of learners."""
    if baseline:
        return "#000000"
    n = max(1, _count(learners))
    return WORKER_COLOURS[(n.bit_length() - 1) % len(WORKER_COLOURS)]
