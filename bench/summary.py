"""The summary table of a run as text, computed from rows.csv (throughput is derived, never stored:
the numbers come from :mod:`bench.derive`, shared with the analysis; this module formats them).

Per cell (rows equal in :data:`bench.contract.CELL_COLUMNS`: op, capacity, variant, grid
parameters ...): the median throughput over the ``ok`` timings (items per call / seconds per
call), its spread as min-max over the same values, and the contract's ratios of medians
(:func:`bench.contract.reference_ratios`, > 1 = faster): ``x binary`` (to the binary tree) and
``x best peer`` (to the fastest available peer library for that run, op, capacity and workload,
named in the ``best peer`` column). Rows of a parameter sweep are told apart by a ``params``
column listing the grid parameters the run swept (K, dtype, batch, ...). Rows that hold no
measurement are listed after the tables, a ``below-resolution`` row with its bound.
"""

from __future__ import annotations

from pathlib import Path

from replaybench.bench import contract, derive, serial_share
from replaybench.bench.contract import format_table  # the one text-table formatter, named here for bench's tables

__all__ = ["format_table", "format_header", "format_rows", "format_threads", "format_bound", "format_run",
           "format_headline", "format_serial_shares"]

#: Grid parameters that are columns of their own (the others are in ``params``).
_WORKLOAD_COLUMNS = ("batch", "transitions", "threads")


def _sortable(value) -> tuple:
    """Numbers (also their repr) before strings, numbers by value: K=2 < K=16."""
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _num(x: float) -> str:
    """Three significant figures, no exponent for the usual ranges."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def format_header(meta: dict | None) -> list[str]:
    """A run's first lines: its id, whether it is complete, its git state and machine, and, for a
    run pyperf timed (meta ``pyperf_settings``: the micro scenario), pyperf's settings. [] for
    no meta (a run folder without meta.json)."""
    if not meta:
        return []
    state = "complete" if meta.get("complete") else "INCOMPLETE (interrupted or still running)"
    sha = (meta.get("git_sha") or "no git")[:10] + (", dirty" if meta.get("dirty") else "")
    machine = meta.get("machine") or {}
    quota = machine.get("cpu_quota")
    out = [f"Run {meta.get('run_id')}: {state}; git {sha}; {machine.get('cpu_model')}, {machine.get('usable_cpus')} CPUs"
           + (f" (a cgroup quota of {quota:g} CPUs' time)" if quota else "")]
    s = meta.get("pyperf_settings") or {}
    if s.get("processes") is not None:
        out.append(f"pyperf: {s.get('processes')} processes x {s.get('values')} values "
                   f"(+{s.get('warmups')} warm-up), loops {'calibrated' if not s.get('loops') else s.get('loops')}, "
                   f"min_time {s.get('min_time')} s")
    return out


def format_rows(rows: list[dict], meta: dict | None = None, *, header: bool = True) -> str:
    """The summary as text: the run's lines (:func:`format_header`, unless ``header`` is false),
    the overhead line, one table per op, then what was not measured."""
    meta = meta or {}
    stats = derive.summarize(rows)
    variants = list(dict.fromkeys(r["variant"] for r in rows if r.get("variant")))
    out = format_header(meta) if header else []
    cells = derive.summarize_cells(rows)
    overhead = next((v for k, v in stats.items() if k[0] == "empty"), None)
    if overhead:  # items_per_call is 1, so 1 / throughput is seconds per call
        out.append(f"Timing-loop overhead (empty op): {1e9 / overhead['median']:.0f} ns per call "
                   f"(min {1e9 / overhead['max']:.0f}, max {1e9 / overhead['min']:.0f}); "
                   f"included in every per-call time below.")
    cell_rows = [{**c["row"], "median": c["median"]} for c in cells.values()]
    ratios = dict(zip(cells, contract.reference_ratios(cell_rows)))
    refs = [(title, name) for title, name in contract.REFERENCES
            if any(c["row"]["variant"] == name for c in cells.values())]
    # the run's grid parameters (meta.json's selection) get a column
    varying = list(((meta.get("selection") or {}).get("params") or {}))

    def grid_value(r, name):
        return r.get(name) if name in _WORKLOAD_COLUMNS else contract.params_of(r.get("params")).get(name)

    def label(r):
        return " ".join(f"{name}={grid_value(r, name)}" for name in varying if grid_value(r, name) is not None)

    def order(key):
        r = cells[key]["row"]
        p = contract.params_of(r.get("params"))
        workload = [r.get("batch"), r.get("transitions"), p.get("mixed_adds")]
        vparams = sorted((k, repr(v)) for k, v in p.items() if k != "mixed_adds")
        return (r["capacity"], variants.index(r["variant"]), [_sortable(v) for v in workload],
                [_sortable(v) for _, v in vparams])

    for op, spec in contract.OPS.items():
        if op == "empty":
            continue
        keys = sorted((k for k, c in cells.items() if c["row"]["op"] == op), key=order)
        if not keys:
            continue
        body = []
        has_peer = any(ratios[k]["best_peer"] for k in keys)
        for key in keys:
            s, r, ratio = cells[key], cells[key]["row"], ratios[key]
            line = [str(r["capacity"]), r["variant"]]
            if varying:
                line.append(label(r) or "-")
            line += [_num(s["median"] / spec.scale), f"{_num(s['min'] / spec.scale)}-{_num(s['max'] / spec.scale)}"]
            for _, name in refs:
                x = ratio[f"x_{name}"]
                line.append(f"{x:.2f}" if x is not None else "-")
            if has_peer:
                peer = ratio["best_peer"]
                line.append(f"{ratio['x_best_peer']:.2f}" if peer else "-")
                line.append(peer.removeprefix(contract.PEER_PREFIX) if peer else "-")
            body.append(line)
        out.append("")
        out.append(f"{op}: {spec.shown_unit} ({spec.item}), median over values")
        header = ["capacity", "variant", *(["params"] if varying else []), "median", "min-max",
                  *(t for t, _ in refs), *(["x best peer", "best peer"] if has_peer else [])]
        first = 3 if varying else 2
        out.extend(format_table(header, body, right={0, *range(first, first + 2 + len(refs) + (1 if has_peer else 0))}))
    threads = format_threads(cells, meta.get("gil_share"), meta.get("memory_limits"))
    if threads:
        out += ["", *threads]
    if meta.get("memory_limits"):
        out += ["", *format_bound(stats, rows, meta["memory_limits"])]
        out += ["", *format_floor(stats, rows, meta["memory_limits"])]
    missing = [r for r in rows if r.get("status") not in (None, contract.MEASURED)]
    if missing:
        out.append("")
        out.append("Not measured:")
        body = [[r.get("variant") or "", str(r.get("capacity") or ""), r.get("op") or "",
                 *([label(r) or "-"] if varying else []), r["status"], _why(r)[:100]] for r in missing]
        header = ["variant", "capacity", "op", *(["params"] if varying else []), "status", "error"]
        out.extend(format_table(header, body, right={1}))
    return "\n".join(out)


def format_threads(cells: dict[tuple, dict], gil_shares: list[dict] | None = None,
                   memory_limits: dict | None = None) -> list[str]:
    """:func:`bench.derive.thread_ratios` as a table (empty when no cell has more than one
    thread). With the run's ``gil_share`` measurements (meta.json), the sample rows add the share
    g of a call that holds the GIL and the bound it sets on T threads, ``T / (1 + (T - 1) g)``
    (Amdahl's law with the GIL-held part serial), and what T threads holding it for that share
    got here with nothing shared (``gil_pair`` at 2, ``gil_threads`` beyond: the handovers
    included, the bound as this machine delivers it). With a memory probe that timed two threads
    (:func:`bench.limits.probe`), 2-thread rows add what two threads gathering random lines,
    each from its own working set of the buffer's size, got over one (the memory system's own
    scaling at that size)."""
    shares = {(g["variant"], g["capacity"]): g for g in gil_shares or ()}
    body = []
    for t in derive.thread_ratios(cells):
        r = t["row"]
        entry = shares.get((r["variant"], r["capacity"]), {}) if r["op"] == "sample" else {}
        g, n = entry.get("gil_share"), r["threads"]
        pair = entry.get("gil_pair") if n == 2 else next(
            (w for w in entry.get("gil_threads") or () if w.get("threads") == n), None)
        memory = None
        if memory_limits and n == 2 and r.get("transitions") in derive.SCHEMAS:
            b = derive.bound_ns(memory_limits, derive.working_set_bytes(
                r["capacity"], derive.row_bytes(derive.SCHEMAS[r["transitions"]])))
            memory = b["gather_ns"] / b["gather_ns_2threads"] if "gather_ns_2threads" in b else None
        body.append([r["op"], str(r["capacity"]), r["variant"], str(n), f"{t['x']:.2f}", f"{t['lo']:.2f}-{t['hi']:.2f}",
                     f"{g:.2f}" if g is not None else "-", f"{n / (1 + (n - 1) * g):.2f}" if g is not None else "-",
                     f"{pair['ratio']:.2f}" if pair else "-",
                     f"{memory:.2f}" if memory is not None else "-"])
    if not body:
        return []
    return ["Threads, each on its own buffer: throughput over one thread's, same run; GIL share of a sample call, "
            "the bound it sets, and what T threads holding the GIL that share of such a call get here with nothing "
            "shared (GIL T thr x 1, the handovers included); random gathers of 2 threads over 1 at the buffer's size",
            *format_table(["op", "capacity", "variant", "threads", "x 1 thread", "min-max", "GIL share", "bound",
                           "GIL T thr x 1", "memory 2 thr x 1"], body, right={1, 3, 4, 5, 6, 7, 8, 9})]


def format_bound(stats: dict, rows: list[dict], memory_limits: dict) -> list[str]:
    """The memory-bound table of :func:`bench.derive.bound_rows` as lines."""
    body = [[f"2^{b['capacity'].bit_length() - 1}", b["op"], b["variant"], f"{b['ns_per_item']:.1f}",
             f"{b['gather_ns']:.1f}", f"{b['latency_ns']:.0f}", f"{b['x_floor']:.1f}"]
            for b in derive.bound_rows(stats, rows, memory_limits)]
    if not body:
        return []
    head = ("Memory bound here (bench/limits.py): ns per item against the random-gather floor and the "
            "dependent-load latency at the buffer's working set (rows + trees)")
    return [head, *format_table(["capacity", "op", "variant", "ns/item", "floor ns", "latency ns", "x floor"], body,
                                {0, 3, 4, 5, 6})]


def format_floor(stats: dict, rows: list[dict], memory_limits: dict) -> list[str]:
    """Every op with a floor (:func:`bench.derive.floor_rows`) as a fraction of it, as lines;
    "no floor measured" where the run's probe has none for a cell (or none at all)."""
    floors = derive.floor_rows(stats, rows, memory_limits)
    if not floors:
        return []
    if not memory_limits.get("op_floors"):
        return ["Op floors: no floor measured (this run's probe predates bench/floors.py)"]
    body = [[f"2^{b['capacity'].bit_length() - 1}", b["op"], b["variant"], f"{b['ns_per_item']:.1f}",
             f"{b['floor_ns']:.1f}" if b["floor_ns"] is not None else "no floor measured",
             f"{b['of_floor']:.3f}" if b["of_floor"] is not None else "-",
             f"BEATS (+{derive.FLOOR_NOISE:.0%} noise)" if b["beats"] else ""] for b in floors]
    head = ("Op floors here (bench/floors.py): ns per item against the floor of the op's own access pattern "
            "(descent levels with all draws in flight, row gather; update upward over two trees); "
            "of floor = floor / ns per item (1 = at the floor)")
    return [head, *format_table(["capacity", "op", "variant", "ns/item", "floor ns", "of floor", ""], body,
                                {0, 3, 4, 5})]


def _why(row: dict) -> str:
    """The error of a row without a measurement; a below-resolution row's bound first."""
    error = row.get("error") or ""
    if row.get("status") != contract.BELOW_RESOLUTION:
        return error
    bound = f"< {row['value']:.3g} {row.get('unit') or ''} (resolution)".replace("  ", " ")
    return f"{bound}; {error}" if error else bound


def format_run(run_dir) -> str:
    """The summary of a stored run folder (rows.csv, and meta.json when there is one).

    Raises
    ------
    bench.contract.RunError
        naming the file and line, when rows.csv or meta.json breaks the results contract.
    """
    run_dir = Path(run_dir)
    meta = contract.read_meta(run_dir) if (run_dir / "meta.json").exists() else {}
    return format_rows(contract.read_rows(run_dir), meta)


def format_headline(run_dirs, capacity: int = 2**20) -> str:
    """One table across the runs of a composite suite (``make bench``): per variant at
    ``capacity``, the median throughput of each micro op, the model's cache misses per
    transition for sample and update (tree only; L1d / LL), and the sample ratio to binary
    and to the best peer, and from a run of several threads (the ``threads`` suite) the sample
    throughput of 2 threads over 1. Runs without such rows simply leave those columns empty;
    folders without a rows.csv are skipped.
    """
    runs = [contract.read_rows(d) for d in run_dirs if contract.has_rows(d)]
    threaded = [any((r.get("threads") or 1) > 1 for r in rs) for rs in runs]
    rows = [r for rs, t in zip(runs, threaded) if not t for r in rs]  # one thread's ratios: one run's
    stats = derive.summarize(rows)
    two_threads = {t["row"]["variant"]: t["x"] for t in derive.thread_ratios(derive.summarize_cells(
        [r for rs, t in zip(runs, threaded) if t for r in rs]))
        if t["row"]["op"] == "sample" and t["row"]["capacity"] == capacity and t["row"]["threads"] == 2}
    misses = {}
    for r in rows:
        if (r.get("scenario") == "cache" and r.get("method") == "model" and r.get("stream") == "tree"
                and r.get("status") == contract.MEASURED and r.get("capacity") == capacity):
            misses[r["variant"], r["op"], r["level"]] = r["value"] / r["items_per_call"]
    variants = sorted({k[2] for k in stats if k[1] == capacity} | {k[0] for k in misses} | set(two_threads),
                      key=lambda v: (v.startswith(contract.PEER_PREFIX), v))
    if not variants:
        return ""
    ops = [("sample", 1e6, "sample M/s"), ("update", 1e6, "update M/s"), ("insert_batch", 1e6, "insert M/s"),
           ("mixed", 1e3, "mixed K it/s")]
    sample = [{"variant": v, "op": op, "capacity": cap, "median": s["median"]}
              for (op, cap, v), s in stats.items() if op == "sample" and cap == capacity]
    ratios = {c["variant"]: x for c, x in zip(sample, contract.reference_ratios(sample))}
    header = ["variant"] + [title for _, _, title in ops] + [
        "sample miss/tr L1d", "LL", "update miss/tr L1d", "LL", "sample x binary", "sample x best peer",
        "sample 2 threads x 1"]
    body = []
    for v in variants:
        line = [v]
        for op, scale, _ in ops:
            s = stats.get((op, capacity, v))
            line.append(_num(s["median"] / scale) if s else "-")
        for op in ("sample", "update"):
            for level in ("L1d", "LL"):
                m = misses.get((v, op, level))
                line.append(f"{m:.2f}" if m is not None else "-")
        x = ratios.get(v, {})
        line += [f"{x[key]:.2f}" if x.get(key) is not None else "-" for key in ("x_binary", "x_best_peer")]
        line.append(f"{two_threads[v]:.2f}" if v in two_threads else "-")
        body.append(line)
    title = (f"Headline at capacity 2^{capacity.bit_length() - 1}: medians from the micro run, misses per "
             f"transition from the cache model (tree only), ratios within the same run")
    return "\n".join([title, *format_table(header, body, set(range(1, len(header))))])


def format_serial_shares(rows: list[dict]) -> list[str]:
    """The serial share of a learner step and of an actor insert per policy, from a concurrency
    run's one-worker cells (:func:`bench.serial_share.one_worker_shares`): the call's time
    split into exclusive sections, lock wait and the rest (us), the share and Amdahl's bound
    at 16 workers. [] when the run has no per-call rows; one line naming the cell when its
    accounts do not sum to the call (the ValueError's message)."""
    try:
        shares = serial_share.one_worker_shares(rows)
    except ValueError as err:
        return [f"Serial shares: not shown: {err}"]
    if not shares:
        return []
    at = shares[0]["at"]
    body = [[e["variant"], e["policy"], e["transitions"], e["mode"],
             "learner step" if e["op"] == "iteration" else "actor insert", f"{1e6 * e['call_s']:.1f}",
             f"{1e6 * e['exclusive_s']:.1f}", f"{1e6 * e['wait_s']:.2f}", f"{1e6 * e['parallel_s']:.1f}",
             f"{100 * e['share']:.1f}%", f"{e['amdahl']:.2f}x"] for e in shares]
    header = ["variant", "policy", "transitions", "mode", "op", "call us", "exclusive us", "wait us", "parallel us",
              "serial share", f"Amdahl at {at}"]
    return ([f"Serial share with one worker: a call's time in sections that exclude every other worker (the tree "
             f"lock held exclusively) over the call's time; Amdahl's bound at {at} workers = 1 / (share + (1 - "
             f"share) / {at})"] + format_table(header, body, set(range(5, len(header)))))
