"""The concurrency scenario: actors insert and learners sample + update one shared buffer,
at a fixed samples-per-insert ratio, as threads and as processes, per policy.

A cell is (variant, policy, transition size, mode, (actors, learners)): the buffer is created
in shared memory with that policy, filled to capacity, and the workers of
:mod:`bench.concurrency_workers` run ``repeats`` timed windows of ``window_s`` seconds. With both
kinds of worker, a rate limiter keeps ``samples_per_insert`` sampled transitions per inserted
one (as a training loop does), so a policy cannot look fast by letting one side starve the
other. Rows per window:

* ``items_per_s`` per op kind (``insert``, ``sample``, ``update``): transitions per second,
  each kind on its own row (kinds are never summed: an inserted and a sampled transition are
  different work);
* per op kind (``insert``; ``iteration`` = one sample and its update): ``busy_s_per_call``
  (seconds inside a call, waits included), ``lock_wait_s_per_call`` and
  ``lock_hold_s_per_call`` (the tree lock's), averaged over the window's calls;
* ``rate_wait_fraction`` (op ``all``): share of worker time spent waiting for the ratio;
* ``lock_wait_fraction`` (op ``all``): share of worker time spent waiting for locks (as
  before the redesign, so older readers still find it);
* ``line_transfer_ns_before`` and ``line_transfer_ns_after`` (op ``all``, one each per cell):
  how long a cache line took to go from one core to the other right before and right after the
  windows (:mod:`bench.line_transfer`; none on one usable core). A virtual machine's vCPUs move
  between physical cores, and what two workers sharing lines get depends on where they sit: a
  ratio is read beside these.

The summary shows per cell the rates and per-call costs and each policy's sample rate as a
ratio to ``global-lock`` in the same run, mode, size and split (``x global-lock``). meta.json
holds this machine's memory limits (:mod:`bench.limits`). With the suite key ``shared_path``
(true), meta.json also gets, per variant, policy and transition size with cells of two learners
(threads or processes), what binds two learners on one buffer (``shared_path``, measured before
the cells, a few seconds per policy):
the GIL's bound ``2 / (1 + share)`` from the share of a learner step that holds it
(:func:`bench.concurrency_workers.shared_gil_share`), what two threads holding the GIL for that
share of a step of that length get on this machine with nothing else shared (``gil_pair``:
:func:`bench.workloads.gil_pair_ratio`, handing the GIL over included), two threads' compiled
learner steps over one thread's (``kernel``: :func:`bench.concurrency_workers.shared_kernel_scaling`), the same
with each thread on a buffer of its own (``kernel_private``: what this machine's two cores give
two such learners with nothing shared, the bound of the shared figures), and
one learner step (sample + update, CPU seconds per call) on the shared buffer over the same
calls on the in-process buffer of the same variant, timed in alternating rounds and taken per
round (``step_over_local``, the median, and ``step_over_local_range``:
:func:`bench.concurrency_workers.step_over_local`); where the cells go past two learners, the
compiled scaling on one buffer and on a buffer each at 4, 8, ... threads up to the most
learners (``kernel_scaling``: whether the machine or the policy stops T learners). The summary
sets them beside the measured learners over one, as threads and as processes. A policy that cannot hold the
variant's tree (NotImplementedError) gives a ``skipped`` row. :mod:`bench.derive`'s scaling
model is fitted to a run (``replaybench plan --run``).

Suite keys (bench/suites/concurrency.json): variants, policies (``"all"``, the default, =
every policy registered in :mod:`impl.concurrent` when the run starts, so a new policy is
measured with no edit here; or a list), transitions (``{kind: {capacity, write_batch,
sample_batch}}`` with kind one of :data:`bench.concurrency_workers.TRANSITIONS`), modes (threads,
processes), workers (``[[actors, learners], ...]``, or ``"auto"``: :func:`auto_workers` for
this machine's cores, or ``"cores"``: :func:`core_workers`, each kind alone and half and half
at 1, 2, 4, ... workers up to the cores), samples_per_insert (optional; default none: no ratio), window_s,
repeats, shared_path (optional, default false). Selection: ``--variants``.
"""

from __future__ import annotations

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.impl.machine import usable_cores

__all__ = ["policy_names", "auto_workers", "core_workers", "Concurrency", "SCENARIO", "format_table"]

MODES = ("threads", "processes")


def policy_names() -> list[str]:
    """The concurrency policies registered in impl.concurrent, read when called."""
    from replaybench.impl import concurrent

    return list(concurrent.names())


def auto_workers(cores: int) -> list[list[int]]:
    """Worker splits from 1 to ``2 * cores`` workers: each kind alone (1 actor; 1 and 2 learners:
    the model's per-op costs and serial fraction), then for every total ``n`` in 2, 3, 4, 6, 8,
    12, 16, ... up to ``2 * cores`` the splits with ``n/4``, ``n/2`` and ``3n/4`` actors (every
    split when ``n <= 4``)."""
    out = [[1, 0], [0, 1], [0, 2]]
    totals = [2, 3, 4] + [t for k in range(2, 8) for t in (3 * 2 ** (k - 1), 2 ** (k + 1))]
    for n in sorted(t for t in set(totals) if t <= max(2, 2 * cores)):
        actors = range(1, n) if n <= 4 else sorted({max(1, min(n - 1, round(n * f))) for f in (0.25, 0.5, 0.75)})
        out += [[a, n - a] for a in actors]
    return out


def core_workers(cores: int) -> list[list[int]]:
    """Worker splits for a scaling curve up to ``cores`` workers: at every ``n`` in 1, 2, 4, ...
    up to ``cores`` (and ``cores`` itself when it is not a power of two), ``n`` learners alone,
    ``n`` actors alone, and from ``n = 2`` on ``n / 2`` of each (the mixed split; rounded down
    for actors at an odd ``n``). ``cores``: the usable ones (affinity-aware:
    :func:`impl.machine.usable_cores`)."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive integer, got {cores!r}")
    counts = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    counts += [cores] if counts[-1] != cores else []
    out = []
    for n in counts:
        out += [[0, n], [n, 0]] + ([[n // 2, n - n // 2]] if n >= 2 else [])
    return out


def _splits(workers, cores: int) -> list:
    """The suite's ``workers`` as a list of ``[actors, learners]`` (``"auto"`` and ``"cores"``
    computed for ``cores``)."""
    return auto_workers(cores) if workers == "auto" else core_workers(cores) if workers == "cores" else workers


def _check(suite: dict) -> None:
    from replaybench.bench.concurrency_workers import TRANSITIONS

    where = f"suite {suite['name']!r}"
    transitions = suite.get("transitions")
    if not isinstance(transitions, dict) or not transitions:
        raise SelectionError(f"{where}: 'transitions' must map a kind ({', '.join(TRANSITIONS)}) to its sizes")
    for kind, t in transitions.items():
        if kind not in TRANSITIONS:
            raise SelectionError(f"{where}: unknown transition kind {kind!r}; known: {', '.join(TRANSITIONS)}")
        for key in ("capacity", "write_batch", "sample_batch"):
            value = t.get(key) if isinstance(t, dict) else None
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SelectionError(f"{where}: transitions.{kind}.{key} must be a positive integer, got {value!r}")
    modes = suite.get("modes")
    if not isinstance(modes, list) or not modes or set(modes) - set(MODES):
        raise SelectionError(f"{where}: 'modes' must be a list of {list(MODES)}, got {modes!r}")
    workers = _splits(suite.get("workers"), usable_cores())
    spi = suite.get("samples_per_insert")
    if spi is not None and (isinstance(spi, bool) or not isinstance(spi, (int, float)) or not 0 < spi < float("inf")):
        raise SelectionError(f"{where}: 'samples_per_insert' must be a positive number, got {spi!r}")
    if not isinstance(workers, list) or not workers or not all(
            isinstance(w, list) and len(w) == 2 and all(isinstance(n, int) and n >= 0 for n in w) and sum(w) > 0
            for w in workers):
        raise SelectionError(f"{where}: 'workers' must be \"auto\", \"cores\" or a list of [actors, learners], got "
                             f"{workers!r}")
    if not isinstance(suite.get("shared_path", False), bool):
        raise SelectionError(f"{where}: 'shared_path' must be true or false, got {suite['shared_path']!r}")
    for key, kind in (("window_s", (int, float)), ("repeats", int)):
        value = suite.get(key)
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            raise SelectionError(f"{where}: {key!r} must be a positive number, got {value!r}")


class Concurrency(Scenario):
    """Per-op rates, per-call costs and lock waits of the shared buffer (see the module docstring)."""

    name = "concurrency"
    suite_keys = frozenset({"variants", "policies", "modes", "workers", "transitions", "samples_per_insert",
                            "shared_path", "repeats", "window_s"})

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.bench.concurrency_workers import TRANSITIONS
        from replaybench.impl import registry

        _check(suite)
        known = policy_names()
        policies = suite.get("policies", "all")
        policies = known if policies == "all" else policies
        unknown = [p for p in policies if p not in known] if isinstance(policies, list) else [policies]
        if unknown or not policies:
            raise SelectionError(f"suite {suite['name']!r}: unknown policies {unknown}; registered: {', '.join(known)}")
        variants = list(selection.variants or suite["variants"])
        try:
            infos = {v: registry.get(v) for v in variants}
        except KeyError as err:
            raise SelectionError(f"--variants: {err.args[0]}") from None
        cores = usable_cores()
        splits = _splits(suite["workers"], cores)
        spi = suite.get("samples_per_insert")
        cells = []
        for variant in variants:
            v = infos[variant]
            for policy in policies:
                for kind, t in suite["transitions"].items():
                    nbytes = TRANSITIONS[kind]
                    for mode in suite["modes"]:
                        for P, L in splits:
                            params = {**v.params, "oversubscribed": P + L > cores, "write_batch": t["write_batch"],
                                      "transition_bytes": nbytes + 16, "cores": cores,
                                      **({"samples_per_insert": spi} if spi is not None and P and L else {})}
                            columns = {"variant": variant, "structure": v.structure, "policy": policy,
                                       "K": v.params.get("K", 2), "dtype": v.params.get("dtype", "float32"),
                                       "params": params, "capacity": t["capacity"], "batch": t["sample_batch"],
                                       "threads": P + L, "transitions": kind, "actors": P, "learners": L,
                                       "mode": mode, "op": "all", "metric": "items_per_s"}
                            cfg = {"nbytes": nbytes, "write_batch": t["write_batch"],
                                   "sample_batch": t["sample_batch"], "window_s": suite["window_s"],
                                   "samples_per_insert": spi}
                            cells.append(Cell(f"{variant} {policy} {kind} {mode} P={P} L={L}", columns,
                                              (cfg, suite["repeats"])))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        from replaybench.bench import limits

        return {"policies": list(dict.fromkeys(c.columns["policy"] for c in cells)),
                "samples_per_insert": suite.get("samples_per_insert"),
                "timing": "per window: items over the slowest worker's seconds; per-call costs averaged over "
                          "the window's calls; workers attach, warm up their kernels and meet at a barrier "
                          "before each window",
                "memory_limits": limits.probe(),
                **({"shared_path": shared_path(cells)} if suite.get("shared_path") else {})}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from replaybench.bench import line_transfer
        from replaybench.bench.concurrency_workers import prefill, run_workers, schema
        from replaybench.impl.concurrent import SharedPrioritizedBuffer

        (cfg, repeats), c = cell.spec, cell.columns
        try:
            buf = SharedPrioritizedBuffer.create(c["capacity"], schema(cfg["nbytes"]), variant=c["variant"],
                                                 policy=c["policy"], seed=0)
        except NotImplementedError as err:  # the policy cannot hold this tree
            return [cell.row("skipped", str(err))]
        try:
            resolved = buf.resolved_params  # recorded as micro rows record them (docs/using.md)
            prefill(buf, c["capacity"], cfg["nbytes"])
            before = line_transfer.probe()
            res = run_workers(buf.handle, c["actors"], c["learners"], c["mode"], cfg, windows=repeats,
                              timeout=60 + 10 * cfg["window_s"] * repeats)
            after = line_transfer.probe()
        finally:
            buf.close()
        params = {**(c.get("params") or {}), **{f"resolved_{k}": v for k, v in resolved.items()}}
        rows = _rows(cell, res, repeats) + [
            cell.row("ok", op="all", metric=f"line_transfer_ns_{when}", value=got["ns"], unit="ns", repeat=0)
            for when, got in (("before", before), ("after", after)) if got is not None]
        return [{**r, "params": params} for r in rows]

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows, meta.get("shared_path"))


SCENARIO = Concurrency()


def shared_path(cells: list[Cell]) -> list[dict]:
    """Per variant, policy and transition size of the cells with two learners (threads or
    processes): the GIL's bound on them and their compiled scaling (module docstring), and where
    the cells go past two learners, the compiled scaling at each power of two up to the most
    (``kernel_scaling``: ``[{"threads", "kernel", "kernel_private"}]``, one buffer and a buffer
    each), and a cache line's trip between two cores right before and after the two-thread
    compiled figures (``line_transfer_ns``: [before, after], :mod:`bench.line_transfer`; absent
    on one usable core); a policy or tree it cannot measure (no fused learner step; every registered policy
    has one) gets its error instead."""
    from replaybench.bench import concurrency_workers as workers
    from replaybench.bench import line_transfer, workloads

    most: dict[tuple, int] = {}
    for cell in cells:
        c = cell.columns
        if c["actors"] == 0:
            key = (c["variant"], c["policy"], c["transitions"])
            most[key] = max(most.get(key, 0), c["learners"])
    out, seen = [], set()
    for cell in cells:
        c = cell.columns
        key = (c["variant"], c["policy"], c["transitions"])
        if c["actors"] != 0 or c["learners"] != 2 or key in seen:
            continue
        seen.add(key)
        entry = {"variant": c["variant"], "policy": c["policy"], "transitions": c["transitions"],
                 "capacity": c["capacity"], "batch": c["batch"]}
        where = dict(variant=c["variant"], batch=c["batch"], transition=c["transitions"])
        try:
            step = workers.shared_gil_share(c["policy"], c["capacity"], **where)["step"]
            lines = [line_transfer.probe()]
            kernel = workers.shared_kernel_scaling(c["policy"], c["capacity"], **where)
            private = workers.shared_kernel_scaling(c["policy"], c["capacity"], shared=False, **where)
            lines.append(line_transfer.probe())
            paired = workers.step_over_local(c["policy"], c["capacity"], **where)
            held = step["gil_share"] * step["call_s"]
            pair = workloads.gil_pair_ratio(held, step["call_s"] - held)
            keys = ("ratio", "ratio_min", "ratio_max", "retries", "steps")
            entry.update(gil_share=step["gil_share"], gil_bound=2.0 / (1.0 + step["gil_share"]),
                         gil_pair={k: pair[k] for k in ("ratio", "ratio_min", "ratio_max")},
                         step_s=paired["shared_s"], local_step_s=paired["local_s"], step_over_local=paired["ratio"],
                         step_over_local_range=[paired["ratio_min"], paired["ratio_max"]],
                         kernel={k: kernel[k] for k in keys}, kernel_private={k: private[k] for k in keys})
            if None not in lines:
                entry["line_transfer_ns"] = [got["ns"] for got in lines]
            wider = [1 << k for k in range(2, most[key].bit_length()) if 1 << k <= most[key]]
            wider += [most[key]] if most[key] > 2 and most[key] not in wider else []
            if wider:
                entry["kernel_scaling"] = [
                    {"threads": t, **{name: {k: got[k] for k in keys} for name, got in (
                        ("kernel", workers.shared_kernel_scaling(c["policy"], c["capacity"], threads=t, **where)),
                        ("kernel_private", workers.shared_kernel_scaling(c["policy"], c["capacity"], threads=t,
                                                                         shared=False, **where)))}}
                    for t in wider]
        except (ValueError, NotImplementedError) as err:  # no fused learner step for this policy or tree
            entry["error"] = f"{type(err).__name__}: {err}"
        out.append(entry)
    return out


#: Per-call metrics per op kind, from the workers' ``<kind>_<name>`` totals.
PER_CALL = {"busy_s_per_call": "busy", "lock_wait_s_per_call": "wait", "lock_hold_s_per_call": "hold"}


def _rows(cell: Cell, res: list[dict], windows: int) -> list[dict]:
    rows = []
    for w in range(windows):
        mine = [r for r in res if r["window"] == w]
        seconds = max(r["seconds"] for r in mine)
        for op in ("insert", "sample", "update"):
            items = sum(r.get(op, 0) for r in mine)
            if any(op in r for r in mine):
                rows.append(cell.row("ok", op=op, value=items / seconds, unit="items/s", repeat=w))
        for kind in ("insert", "iteration"):
            calls = sum(r.get(f"{kind}_calls", 0) for r in mine)
            for metric, name in PER_CALL.items():
                if calls:
                    value = sum(r.get(f"{kind}_{name}", 0.0) for r in mine) / calls
                    rows.append(cell.row("ok", op=kind, metric=metric, value=value, unit="s", repeat=w))
        worker_seconds = sum(r["seconds"] for r in mine)
        rows.append(cell.row("ok", op="all", metric="lock_wait_fraction", unit="1", repeat=w,
                             value=sum(r["lock_wait"] for r in mine) / worker_seconds))
        rows.append(cell.row("ok", op="all", metric="rate_wait_fraction", unit="1", repeat=w,
                             value=sum(r.get("rate_wait", 0.0) for r in mine) / worker_seconds))
    return rows


def _medians(rows: list[dict]) -> dict[tuple, dict]:
    """``{cell: {(op, metric): median over windows}}`` of the ``ok`` rows."""
    import statistics

    keys = ("variant", "policy", "transitions", "mode", "actors", "learners")
    values: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") == "ok":
            values.setdefault(tuple(r[k] for k in keys), {}).setdefault((r["op"], r["metric"]), []).append(r["value"])
    return {k: {m: statistics.median(v) for m, v in by.items()} for k, by in values.items()}


def format_table(rows: list[dict], shared: list[dict] | None = None) -> str:
    """Per cell (medians over windows): items/s of insert, sample and update (each kind on its
    own), the sample rate as a ratio to global-lock in the same mode, size and split, the
    per-call busy time, lock wait and lock hold of inserts and of learner iterations, and the
    share of time spent waiting for locks and for the ratio; then the one-worker serial shares
    and Amdahl's bound at 16 (:func:`bench.summary.format_serial_shares`); then, with a run's
    ``shared_path`` (meta.json), what binds two learner threads per policy; then the cells that did not run."""
    from replaybench.bench.summary import format_serial_shares
    from replaybench.bench.summary import format_table as table

    med = _medians(rows)

    def rate(m, op):
        x = m.get((op, "items_per_s"))
        return f"{x:,.3g}" if x is not None else "-"

    def us(m, kind, metric):
        x = m.get((kind, metric))
        return f"{1e6 * x:.1f}" if x is not None else "-"

    body = []
    for key, m in med.items():
        base = med.get((key[0], "global-lock", *key[2:]), {}).get(("sample", "items_per_s"))
        mine = m.get(("sample", "items_per_s"))
        ratio = f"{mine / base:.2f}" if base and mine is not None else "-"
        frac = [f"{m[('all', f)]:.2f}" if ("all", f) in m else "-" for f in ("lock_wait_fraction", "rate_wait_fraction")]
        body.append([str(k) for k in key] + [rate(m, "insert"), rate(m, "sample"), rate(m, "update"), ratio]
                    + [us(m, kind, metric) for kind in ("insert", "iteration")
                       for metric in ("busy_s_per_call", "lock_wait_s_per_call", "lock_hold_s_per_call")] + frac
                    + [line_ns(m.get(("all", "line_transfer_ns_before")), m.get(("all", "line_transfer_ns_after")))])
    header = ["variant", "policy", "transitions", "mode", "A", "L", "insert/s", "sample/s", "update/s",
              "x global-lock", "ins us", "ins wait", "ins hold", "iter us", "iter wait", "iter hold", "lock wait",
              "rate wait", "line ns"]
    out = ["Per op kind: items/s (never summed); per call (us): busy, lock wait, lock hold; "
           "iteration = sample + update; x global-lock = sample/s over global-lock's in the same mode and split; "
           "line ns = a cache line's trip between two cores before/after the cell (bench/line_transfer.py: "
           "where a VM's vCPUs sat)"]
    out += table(header, body, set(range(4, len(header)))) if body else ["(no concurrency rows)"]
    shares = format_serial_shares(rows)
    if shares:
        out += ["", *shares]
    if shared:
        out += ["", *format_shared_path(shared, med)]
    missing = [r for r in rows if r.get("status") != "ok"]
    if missing:
        body = [[r["variant"], r["policy"], r["transitions"], r["mode"], str(r["actors"]), str(r["learners"]),
                 r["status"], (r.get("error") or "")[:100]] for r in missing]
        out += ["", "Not measured:", *table(header[:6] + ["status", "error"], body, set())]
    return "\n".join(out)


def format_shared_path(shared: list[dict], med: dict[tuple, dict]) -> list[str]:
    """The lines of the "what binds two learners" table: per ``shared_path`` entry, the GIL's
    bound, the compiled two threads over one (median and range) and the measured two learners
    over one (sample/s medians of the cells with 0 actors), as threads and as processes."""
    from replaybench.bench import derive
    from replaybench.bench.summary import format_table as table

    def measured(e, mode, n=2):
        key = (e["variant"], e["policy"], e["transitions"], mode)
        one, many = (med.get((*key, 0, k), {}).get(("sample", "items_per_s")) for k in (1, n))
        return f"{many / one:.2f}" if one and many else "-"

    body = []
    for e in shared:
        k, own = e.get("kernel"), e.get("kernel_private")
        body.append([e["variant"], e["policy"], e["transitions"],
                     derive.step_over_local_cell(e),
                     f"{e['gil_bound']:.2f}" if "gil_bound" in e else "-",
                     ratio_range(e["gil_pair"]) if e.get("gil_pair") else "-",
                     ratio_range(own) if own else "-",
                     ratio_range(k) if k else e.get("error", "-")[:60],
                     line_ns(*(e.get("line_transfer_ns") or [None, None])),  # older runs lack it
                     measured(e, "threads"), measured(e, "processes")])
    header = ["variant", "policy", "transitions", "step x local", "GIL bound", "GIL 2T x 1 here",
              "kernel 2T x 1 own buffers", "kernel 2T x 1", "kernel line ns", "threads 2 x 1", "processes 2 x 1"]
    return (["One learner step on the shared buffer over the in-process one (step x local); two learners over one "
             "(sample/s): the GIL's bound 2/(1+share of a step holding it), what two threads holding the GIL that "
             "share of such a step get on this machine with nothing shared (GIL 2T x 1 here: handing the GIL over "
             "included), two threads' compiled steps each on a buffer of its own (nothing shared: the machine's "
             "bound) and on one buffer (no Python: the policy's locks and the shared lines), and the measured "
             "ratios on one buffer; kernel line ns: a cache line's trip between two cores before/after the kernel "
             "figures"]
            + table(header, body, {3, 4, 8, 9, 10}) + _format_kernel_scaling(shared, measured))


def _format_kernel_scaling(shared: list[dict], measured) -> list[str]:
    """The lines of the "what binds T learners" table, from the entries' ``kernel_scaling``
    (none without one): per policy and T, T threads' compiled steps over one's, each on a buffer
    of its own and on one buffer, beside the measured T learners over one."""
    from replaybench.bench.summary import format_table as table

    body = [[e["variant"], e["policy"], e["transitions"], str(s["threads"]), ratio_range(s["kernel_private"]),
             ratio_range(s["kernel"]), measured(e, "threads", s["threads"]), measured(e, "processes", s["threads"])]
            for e in shared for s in e.get("kernel_scaling", [])]
    if not body:
        return []
    header = ["variant", "policy", "transitions", "T", "kernel T x 1 own buffers", "kernel T x 1",
              "threads T x 1", "processes T x 1"]
    return ["", "T learners over one (sample/s): T threads' compiled steps each on a buffer of its own (nothing "
            "shared: the machine's bound on T such learners) and on one buffer (the policy's synchronisation and "
            "shared lines, no Python), beside the measured ratios on one buffer"] + table(header, body, {3, 6, 7})


def line_ns(before, after) -> str:
    """A cell's line transfers before and after it, ``28/210`` (ns), or ``-`` where not measured."""
    if before is None and after is None:
        return "-"
    return "/".join("-" if x is None else f"{x:.0f}" for x in (before, after))


def ratio_range(k: dict) -> str:
    """A compiled scaling's median and range, ``1.26 (1.03-1.38)``."""
    return f"{k['ratio']:.2f} ({k['ratio_min']:.2f}-{k['ratio_max']:.2f})"
