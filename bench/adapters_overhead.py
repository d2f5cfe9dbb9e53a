"""What each framework adapter adds to our buffer's own sample + update, in one process.

For each framework, three callables each do one training step's replay work, ``sample`` of
``batch`` transitions and the priority update of the sampled ones, on a full buffer of
``capacity`` CartPole-shaped transitions (4 float32 observations, a discrete action, reward,
done) whose slots hold random priorities:

========  ==========================================  ==========================================
kind      sb3 / tianshou / torchrl                     what it is
========  ==========================================  ==========================================
adapter   ``PrioritizedReplayBuffer.sample`` +         the framework's calls through
          ``update_priorities`` / vector buffer        :mod:`replaybench.adapters`, with TD errors
          ``sample`` + ``update_weight`` /             as the framework's DQN hands them (a NumPy
          ``TensorDictPrioritizedReplayBuffer.sample``  array in SB3, a tensor in the others)
          + ``update_tensordict_priority``
bare      our variant buffer's ``sample(out=...)`` +   the floor: the same variant, fields, batch
          ``update_priorities``                        and capacity, no framework container
own       SB3's ``ReplayBuffer.sample`` (uniform: SB3  the framework's own buffer doing the same
          has no prioritized buffer; no update) /
          Tianshou's ``PrioritizedVectorReplayBuffer``
          / TorchRL's ``PrioritizedSampler``
========  ==========================================  ==========================================

Each kind also has an ``add-`` twin timing the add of one environment step (one row: SB3's
``add``, Tianshou's ``add`` with ``buffer_ids=[0]`` as its ``Collector`` calls it, TorchRL's
``extend``), which overwrites the oldest slot of the same full buffer, as in a training
loop's steady state; a DQN loop adds ``train_freq`` steps per sample + update.

``adapter - bare`` is the adapter's share: the framework's container work (Tianshou's
``Batch`` gather, TorchRL's ``TensorDict`` indexing, SB3's tensor copies) plus the adapter's
own conversions; ``adapter / own`` is what a user of the framework sees when switching
buffers. To split the share, the framework's container work is timed alone where the adapter
leaves it to the framework (``container``): the gather of a batch into Tianshou's ``Batch``
(the adapter's ``gather``, the one its ``sample`` calls), and for TorchRL the
buffer call minus the sampler, which is timed alone (``sampler``: its ``sample`` and
``update_priority`` against the storage, as TorchRL's buffer calls them; ``own-sampler`` the
same with TorchRL's sampler). ``adapter - container`` is then the code the adapter runs (the
draw, the weights, the update, the conversions); in SB3 all of it is.

Timing: ``repeats`` rounds; each round times every callable over ``number`` calls, in an
order shuffled per round (drift and a neighbour's load fall on all of them alike, as
google-benchmark's interleaving does), after ``warmup`` untimed calls each. Reported: the
median per call over the rounds, in microseconds. The machine's other load shows in the
spread (``--spread`` prints the interquartile range): compare figures of one run only. Torch
runs on one thread (``torch_threads``), as the frameworks suite runs it: its intra-op pool
otherwise waits for busy cores on a shared machine (milliseconds per reduction).

Run: ``python -m replaybench.bench.adapters_overhead [--frameworks sb3,torchrl] [--repeats 200]``;
a framework that does not import is reported as unavailable, not run. The pytest-benchmark
entry ``bench/pytest_suite/test_adapters.py`` times the same callables (``make bench-pytest``).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

__all__ = ["FRAMEWORKS", "KINDS", "calls", "measure", "format_rows", "main"]

FRAMEWORKS = ("sb3", "tianshou", "torchrl")
KINDS = ("adapter", "bare", "own")
#: The frameworks suite's settings (bench/scenarios/frameworks.py HYPER).
CAPACITY, BATCH, ALPHA, BETA = 50_000, 64, 0.6, 0.4
OBS = 4


def _transitions(capacity: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((capacity + 1, OBS)).astype(np.float32)
    return {"obs": obs[:-1], "next_obs": obs[1:], "action": rng.integers(0, 2, capacity),
            "reward": np.ones(capacity, np.float32), "done": rng.random(capacity) < 0.02,
            "priority": rng.random(capacity)}


def _bare(t: dict, capacity: int, batch: int, variant: str, seed: int) -> dict[str, Callable]:
    """Our variant buffer with the SB3 adapter's fields, sampled into reused arrays."""
    from replaybench.impl import registry

    fields = {"obs": ((OBS,), np.float32), "next_obs": ((OBS,), np.float32), "action": ((1,), np.int64),
              "reward": ((), np.float32), "done": ((), np.float32), "timeout": ((), np.float32)}
    buf = registry.create(variant, capacity=capacity, fields=fields, alpha=ALPHA, beta=BETA, seed=seed)
    buf.add({"obs": t["obs"], "next_obs": t["next_obs"], "action": t["action"].reshape(-1, 1),
             "reward": t["reward"], "done": t["done"].astype(np.float32), "timeout": np.zeros(capacity, np.float32)},
            priorities=t["priority"])
    out, td = buf.sample_out(batch), np.random.default_rng(seed).random(batch)
    step = {"obs": t["obs"][:1], "next_obs": t["next_obs"][:1], "action": t["action"][:1].reshape(1, 1),
            "reward": t["reward"][:1], "done": np.zeros(1, np.float32), "timeout": np.zeros(1, np.float32)}

    def call():
        buf.update_priorities(buf.sample(batch, out=out)["indices"], td)
    return {"bare": call, "add-bare": lambda: buf.add(step)}


def _sb3(t: dict, capacity: int, batch: int, variant: str, seed: int, adapter=None) -> dict[str, Callable]:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    if adapter is None:
        from replaybench.adapters.sb3 import PrioritizedReplayBuffer as adapter
    obs_space, act_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32), spaces.Discrete(2)
    ours = adapter(capacity, obs_space, act_space, device="cpu", variant=variant, alpha=ALPHA, beta=BETA, seed=seed)
    own = ReplayBuffer(capacity, obs_space, act_space, device="cpu")
    for buf in (ours, own):  # one add per step, as SB3's DQN does it, in chunks here (n_envs rows each)
        for i in range(capacity):
            buf.add(t["obs"][i: i + 1], t["next_obs"][i: i + 1], t["action"][i: i + 1], t["reward"][i: i + 1],
                    t["done"][i: i + 1], [{}])
    ours.update_priorities(np.arange(capacity), t["priority"])
    td = np.random.default_rng(seed).random(batch)

    def adapter_call():
        data = ours.sample(batch)
        ours.update_priorities(data.indices, td)
    step = (t["obs"][:1], t["next_obs"][:1], t["action"][:1], t["reward"][:1], t["done"][:1], [{}])
    return {"adapter": adapter_call, "own": lambda: own.sample(batch),
            "add-adapter": lambda: ours.add(*step), "add-own": lambda: own.add(*step)}


def _tianshou(t: dict, capacity: int, batch: int, variant: str, seed: int, adapter=None) -> dict[str, Callable]:
    import torch
    from tianshou.data import Batch
    from tianshou.data import PrioritizedVectorReplayBuffer as Own

    if adapter is None:
        from replaybench.adapters.tianshou import PrioritizedVectorReplayBuffer as adapter
    ours = adapter(capacity, 1, ALPHA, BETA, variant=variant, random_seed=seed)
    own = Own(capacity, 1, alpha=ALPHA, beta=BETA)
    rows = Batch(obs=t["obs"], act=t["action"], rew=t["reward"], terminated=t["done"],
                 truncated=np.zeros(capacity, bool), obs_next=t["next_obs"], info=Batch())
    for buf in (ours, own):
        for i in range(capacity):  # one row per environment step, as Tianshou's Collector adds them
            buf.add(rows[i: i + 1], buffer_ids=[0])
        buf.update_weight(np.arange(capacity), t["priority"])
    td = torch.from_numpy(np.random.default_rng(seed).random(batch).astype(np.float32))

    def step(buf):
        def call():
            _, indices = buf.sample(batch)
            buf.update_weight(indices, td)
        return call
    # Index batches as the adapter draws them, cycled: a fixed batch would stay in cache.
    pool = itertools.cycle([ours.sample_indices(batch) for _ in range(256)])
    one = rows[:1]
    return {"adapter": step(ours), "own": step(own), "gather": lambda: ours.gather(next(pool)),
            "add-adapter": lambda: ours.add(one, buffer_ids=[0]), "add-own": lambda: own.add(one, buffer_ids=[0])}


def _torchrl(t: dict, capacity: int, batch: int, variant: str, seed: int, adapter=None) -> dict[str, Callable]:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as Own

    from replaybench.adapters.torchrl import TensorDictPrioritizedReplayBuffer

    torch.manual_seed(seed)
    data = TensorDict({"observation": torch.from_numpy(t["obs"]), "action": torch.from_numpy(t["action"]),
                       "next": TensorDict({"observation": torch.from_numpy(t["next_obs"]),
                                           "reward": torch.from_numpy(t["reward"]).unsqueeze(-1),
                                           "done": torch.from_numpy(t["done"]).unsqueeze(-1)}, [capacity])},
                      [capacity])
    td = torch.from_numpy(np.random.default_rng(seed).random(batch).astype(np.float32))
    out = {}
    for name in ("adapter", "own"):
        if name == "own":
            rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=Own(capacity, ALPHA, BETA),
                                        priority_key="td_error", batch_size=batch)
        elif adapter is None:  # ours as a TorchRL user builds it (its fast extend, sample and update)
            rb = TensorDictPrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity),
                                                   priority_key="td_error", batch_size=batch, variant=variant)
        else:  # another version of our sampler, in TorchRL's own buffer
            rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), priority_key="td_error",
                                        sampler=adapter(capacity, ALPHA, BETA, variant=variant), batch_size=batch)
        sampler = rb._sampler
        rb.extend(data)
        rb.update_priority(torch.arange(capacity), torch.from_numpy(t["priority"].astype(np.float32)))

        def call(rb=rb):
            sample = rb.sample()
            sample.set("td_error", td)
            rb.update_tensordict_priority(sample)

        def sampler_call(sampler=sampler, storage=rb._storage):
            index, _ = sampler.sample(storage, batch)
            sampler.update_priority(index, td, storage=storage)
        out[name], out["sampler" if name == "adapter" else "own-sampler"] = call, sampler_call
        out[f"add-{name}"] = functools.partial(rb.extend, data[:1])
    return out


SETUPS = {"sb3": _sb3, "tianshou": _tianshou, "torchrl": _torchrl}


def calls(framework: str, *, capacity: int = CAPACITY, batch: int = BATCH, variant: str = "kary-aligned",
          seed: int = 0, adapter=None) -> dict[str, Callable[[], None]]:
    """The callables of ``framework`` (see the module docstring), by kind, each set up (a full
    buffer) and ready to time; ``adapter``: the adapter class to time instead of the current
    one (to compare two versions in one process; for TorchRL a sampler class, timed in TorchRL's
    ``TensorDictReplayBuffer`` instead of our ``TensorDictPrioritizedReplayBuffer``). Set-up
    costs seconds (one add per step)."""
    if framework not in SETUPS:
        raise ValueError(f"framework must be one of {list(SETUPS)}, got {framework!r}")
    for name, value in (("capacity", capacity), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    t = _transitions(capacity, seed)
    return {**SETUPS[framework](t, capacity, batch, variant, seed, adapter), **_bare(t, capacity, batch, variant, seed)}


def measure(named: dict[str, Callable[[], None]], *, repeats: int = 200, number: int = 10, warmup: int = 50,
            seed: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each callable, one value per round (see the module docstring)."""
    for name, value in (("repeats", repeats), ("number", number)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for fn in named.values():
        for _ in range(warmup):
            fn()
    order, shuffle = list(named), random.Random(seed).shuffle
    times: dict[str, list[float]] = {name: [] for name in named}
    clock = time.perf_counter
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            fn = named[name]
            start = clock()
            for _ in range(number):
                fn()
            times[name].append((clock() - start) / number)
    return times


def summarize(framework: str, times: dict[str, list[float]]) -> dict:
    """Medians (us) per kind, the adapter's share (adapter - bare), adapter / own, and the
    share split into the framework's container work and the adapter's own code."""
    med = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    row = {"framework": framework, **med, "share": med["adapter"] - med["bare"],
           "adapter/own": med["adapter"] / med["own"]}
    if "gather" in med:
        row["container"] = med["gather"]
    elif "sampler" in med:
        row["container"] = med["adapter"] - med["sampler"]
        row["sampler/own-sampler"] = med["sampler"] / med["own-sampler"]
    else:
        row["container"] = 0.0
    row["adapter code"] = med["adapter"] - row["container"]
    if "add-adapter" in med:
        row["add"] = {kind: med[f"add-{kind}"] for kind in KINDS}
        row["add"]["adapter/own"] = med["add-adapter"] / med["add-own"]
    row["iqr"] = {name: (np.percentile(v, 75) - np.percentile(v, 25)) * 1e6 for name, v in times.items()}
    return row


def format_rows(rows: list[dict], spread: bool = False) -> str:
    """A plain-text table of :func:`summarize` rows (microseconds per sample + update)."""
    lines = [f"{'framework':<10}{'adapter':>9}{'bare':>8}{'own':>8}{'share':>8}{'adapter/own':>13}"
             f"{'container':>11}{'adapter code':>14}   sampler alone (ours / own)"]
    for r in rows:
        extra = (f"   {r['sampler']:.1f} / {r['own-sampler']:.1f} = {r['sampler/own-sampler']:.2f}"
                 if "sampler" in r else "")
        lines.append(f"{r['framework']:<10}{r['adapter']:>9.1f}{r['bare']:>8.1f}{r['own']:>8.1f}{r['share']:>8.1f}"
                     f"{r['adapter/own']:>13.2f}{r['container']:>11.1f}{r['adapter code']:>14.1f}{extra}")
        if "add" in r:
            a = r["add"]
            lines.append(f"  add of one step: adapter {a['adapter']:.1f}, bare {a['bare']:.1f}, own {a['own']:.1f}, "
                         f"adapter/own {a['adapter/own']:.2f}")
        if spread:
            lines.append("  iqr: " + ", ".join(f"{k} {v:.1f}" for k, v in r["iqr"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybench.bench.adapters_overhead",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated (default: all)")
    parser.add_argument("--capacity", type=int, default=CAPACITY)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--variant", default="kary-aligned")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--number", type=int, default=10)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--spread", action="store_true", help="print each kind's interquartile range")
    args = parser.parse_args(argv)
    chosen = [f for f in args.frameworks.split(",") if f]
    bad = [f for f in chosen if f not in FRAMEWORKS]
    if bad:
        parser.error(f"--frameworks: {bad} not among {list(FRAMEWORKS)}")
    for name in ("capacity", "batch", "repeats", "number", "torch_threads"):  # before any set-up
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    from replaybench.adapters import availability

    import torch

    torch.set_num_threads(args.torch_threads)
    rows = []
    for framework in chosen:
        ok, why = availability(framework)[framework]
        if not ok:
            print(f"{framework}: unavailable ({why})", file=sys.stderr)
            continue
        named = calls(framework, capacity=args.capacity, batch=args.batch, variant=args.variant)
        rows.append(summarize(framework, measure(named, repeats=args.repeats, number=args.number)))
    print(format_rows(rows, args.spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
