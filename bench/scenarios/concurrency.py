"""The concurrency scenario: P writers and L samplers/updaters on one shared buffer.

A cell is (variant, policy, transition size, mode, (P, L)): the buffer is created in shared
memory with that policy, filled to capacity, and the workers of :mod:`bench.concurrency`
(threads or processes) run ``repeats`` timed windows of ``window_s`` seconds. Rows per window:
aggregate items/s of insert, sample and update (metric ``items_per_s``) and the share of worker
time spent waiting for locks (op ``all``, metric ``lock_wait_fraction``). A policy that cannot
hold the variant's tree (NotImplementedError) gives a ``skipped`` row.

Suite keys (bench/suites/concurrency.json): variants, policies (``"all"``, the default, =
every policy registered in :mod:`impl.concurrent` when the run starts, so a new policy is
measured with no edit here; or a list), transitions (``{kind: {capacity, write_batch,
sample_batch}}`` with kind one of :data:`bench.concurrency.TRANSITIONS`), modes (threads,
processes), workers (``[[P, L], ...]``), window_s, repeats. Selection: ``--variants``.
"""

from __future__ import annotations

import os

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError

__all__ = ["policy_names", "Concurrency", "SCENARIO"]

MODES = ("threads", "processes")


def policy_names() -> list[str]:
    """The concurrency policies registered in impl.concurrent, read when called."""
    from replaybench.impl import concurrent

    return list(concurrent.names())


def _check(suite: dict) -> None:
    from replaybench.bench.concurrency import TRANSITIONS

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
    workers = suite.get("workers")
    if not isinstance(workers, list) or not workers or not all(
            isinstance(w, list) and len(w) == 2 and all(isinstance(n, int) and n >= 0 for n in w) and sum(w) > 0
            for w in workers):
        raise SelectionError(f"{where}: 'workers' must be a list of [writers, learners], got {workers!r}")
    for key, kind in (("window_s", (int, float)), ("repeats", int)):
        value = suite.get(key)
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            raise SelectionError(f"{where}: {key!r} must be a positive number, got {value!r}")


class Concurrency(Scenario):
    """Aggregate throughput and lock waits of the shared buffer (see the module docstring)."""

    name = "concurrency"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.bench.concurrency import TRANSITIONS
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
        cores = os.cpu_count() or 1
        cells = []
        for variant in variants:
            v = infos[variant]
            for policy in policies:
                for kind, t in suite["transitions"].items():
                    nbytes = TRANSITIONS[kind]
                    for mode in suite["modes"]:
                        for P, L in suite["workers"]:
                            params = {**v.params, "oversubscribed": P + L > cores, "write_batch": t["write_batch"],
                                      "transition_bytes": nbytes + 16}
                            columns = {"variant": variant, "structure": v.structure, "policy": policy,
                                       "K": v.params.get("K", 2), "dtype": v.params.get("dtype", "float32"),
                                       "params": params, "capacity": t["capacity"], "batch": t["sample_batch"],
                                       "threads": P + L, "transitions": kind, "actors": P, "learners": L,
                                       "mode": mode, "op": "all", "metric": "items_per_s"}
                            cfg = {"nbytes": nbytes, "write_batch": t["write_batch"],
                                   "sample_batch": t["sample_batch"], "window_s": suite["window_s"]}
                            cells.append(Cell(f"{variant} {policy} {kind} {mode} P={P} L={L}", columns,
                                              (cfg, suite["repeats"])))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"policies": list(dict.fromkeys(c.columns["policy"] for c in cells)),
                "timing": "per window: items over the slowest worker's seconds; workers attach, warm up their "
                          "kernels and meet at a barrier before each window"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from replaybench.bench.concurrency import prefill, run_workers, schema
        from replaybench.impl.concurrent import SharedPrioritizedBuffer

        (cfg, repeats), c = cell.spec, cell.columns
        try:
            buf = SharedPrioritizedBuffer.create(c["capacity"], schema(cfg["nbytes"]), variant=c["variant"],
                                                 policy=c["policy"], seed=0)
        except NotImplementedError as err:  # the policy cannot hold this tree
            return [cell.row("skipped", str(err))]
        try:
            prefill(buf, c["capacity"], cfg["nbytes"])
            res = run_workers(buf.handle, c["actors"], c["learners"], c["mode"], cfg, windows=repeats,
                              timeout=60 + 10 * cfg["window_s"] * repeats)
        finally:
            buf.close()
        return _rows(cell, res, repeats)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows)


SCENARIO = Concurrency()


def _rows(cell: Cell, res: list[dict], windows: int) -> list[dict]:
    rows = []
    for w in range(windows):
        mine = [r for r in res if r["window"] == w]
        seconds = max(r["seconds"] for r in mine)
        for op in ("insert", "sample", "update"):
            items = sum(r.get(op, 0) for r in mine)
            if any(op in r for r in mine):
                rows.append(cell.row("ok", op=op, value=items / seconds, unit="items/s", repeat=w))
        wait = sum(r["lock_wait"] for r in mine) / sum(r["seconds"] for r in mine)
        rows.append(cell.row("ok", op="all", metric="lock_wait_fraction", value=wait, unit="1", repeat=w))
    return rows


def format_table(rows: list[dict]) -> str:
    """Per cell: median items/s of each op and of insert + sample (aggregate), and the median
    lock-wait share, over the cell's windows; then the cells that did not run."""
    import statistics

    from replaybench.bench.summary import format_table as table

    keys = ("variant", "policy", "transitions", "mode", "actors", "learners")
    cells: dict[tuple, dict] = {}
    for r in rows:
        if r.get("status") == "ok":
            per_window = cells.setdefault(tuple(r[k] for k in keys), {}).setdefault(r["repeat"], {})
            per_window[r["op"] if r["metric"] == "items_per_s" else "lock wait"] = r["value"]
    ops = ("insert", "sample", "update")

    def median(windows, name):
        values = [w[name] for w in windows if name in w]
        return f"{statistics.median(values):,.3g}" if values else "-"

    body = []
    for key, by_window in cells.items():
        windows = [{**w, "aggregate/s": w.get("insert", 0.0) + w.get("sample", 0.0)} for w in by_window.values()]
        body.append([str(k) for k in key] + [median(windows, name) for name in (*ops, "aggregate/s", "lock wait")])
    header = ["variant", "policy", "transitions", "mode", "P", "L", *ops, "aggregate/s", "lock wait"]
    out = table(header, body, set(range(4, len(header)))) if body else ["(no concurrency rows)"]
    missing = [r for r in rows if r.get("status") != "ok"]
    if missing:
        body = [[r["variant"], r["policy"], r["transitions"], r["mode"], str(r["actors"]), str(r["learners"]),
                 r["status"], (r.get("error") or "")[:100]] for r in missing]
        out += ["", "Not measured:", *table(header[:6] + ["status", "error"], body, set())]
    return "\n".join(out)
