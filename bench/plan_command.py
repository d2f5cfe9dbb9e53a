"""``replaybench plan --run results/<id> --cores 4,8,16``: the scaling model of a concurrency run.

For each (variant, policy, mode, transition size) of the run: the model's inputs
(:func:`bench.derive.costs_from_rows`), its prediction against every measured cell
of the run (error per cell; the 1-actor, 1- and 2-learner cells, and the 2-actor one where present,
are the inputs), and the best
actor/learner split with its predicted rates and binding bound at each requested core count.
Then the model of the one-worker serial shares (:mod:`bench.serial_share`: Amdahl's law for a
mix of actors and learners, inputs the 1-actor and 1-learner cells only): each op's serial
share and Amdahl's bound at 16, and its prediction against every cell, with the account that
explains each cell it misses by more than 25% (:func:`format_serial_model`).
"""

from __future__ import annotations

import sys

__all__ = ["format_plan", "add_parser"]

DEFAULT_CORES = (4, 8, 16, 32, 64)
#: The most cores ``--cores`` may ask for: far past any one machine the model's measured costs
#: describe, and the search (:func:`bench.derive.best_split`) evaluates a few splits of every
#: worker count up to it, so a count of millions would run for minutes.
MAX_CORES = 1 << 16


def format_plan(rows: list[dict], cores: list[int], machine_cores: int | None = None) -> str:
    """The text ``replaybench plan`` prints for the concurrency ``rows`` of one run."""
    from replaybench.bench import derive
    from replaybench.bench.summary import format_table

    configs = sorted({(r["variant"], r["policy"], r["mode"], r["transitions"]) for r in rows
                      if r.get("scenario") == "concurrency" and r.get("status") == "ok"})
    if not configs:
        raise ValueError("the run has no measured concurrency rows")
    out = []
    for variant, policy, mode, transitions in configs:
        where = dict(variant=variant, policy=policy, mode=mode, transitions=transitions)
        title = f"{policy} / {mode} / {transitions} ({variant})"
        try:
            costs = derive.costs_from_rows(rows, cores=machine_cores, **where)
        except ValueError as err:
            out += ["", f"{title}: {err}"]
            continue
        c = costs
        out += ["", title,
                f"  inputs: insert {1e6 * c.insert_s:.1f} us/call (hold {1e6 * c.insert_hold_s:.1f}), iteration "
                f"{1e6 * c.iteration_s:.1f} us/call (hold {1e6 * c.iteration_hold_s:.1f}), serial fraction "
                f"{c.serial_fraction:.2f} (learners)"
                + (f" / {c.insert_serial_fraction:.2f} (actors)" if c.insert_serial_fraction is not None else "")
                + f", {c.samples_per_insert:g} samples per insert"]
        checked = derive.validate_model(rows, costs, machine_cores or 1, **where)
        body = [[f"{v['actors']}A+{v['learners']}L", f"{v['measured']:,.3g}", f"{v['predicted']:,.3g}",
                 f"{100 * v['error']:+.0f}%", v["bound"], "input" if v["input"] else ""] for v in checked]
        out += ["  " + line for line in format_table(["split", "measured/s", "predicted/s", "error", "bound", ""],
                                                      body, {1, 2, 3})]
        body = []
        for n in cores:
            if n < 2:
                continue
            p = derive.best_split(n, costs)
            body.append([str(n), f"{p.actors}A+{p.learners}L", f"{p.sample_per_s:,.3g}", f"{p.insert_per_s:,.3g}",
                         p.bound])
        if body:
            out += ["  " + line for line in format_table(["cores", "best split", "sample/s", "insert/s", "bound"],
                                                          body, {0, 2, 3})]
        out += format_serial_model(rows, machine_cores or 1, **where)
    return "\n".join(out).lstrip("\n")


def format_serial_model(rows: list[dict], cores: int, **where) -> list[str]:
    """The lines of the serial-share model for one configuration (``where``: variant, policy,
    mode, transitions): the shares, then predicted against measured per cell with the missed
    term; one line saying why when the run lacks the one-worker accounts."""
    from replaybench.bench import serial_share
    from replaybench.bench.summary import format_table

    mine = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    try:
        shares = serial_share.one_worker_shares(mine)
        cells = serial_share.predict_cells(rows, cores, **where)
    except ValueError as err:
        return [f"  serial-share model: {err}"]
    text = ", ".join(f"{'learner step' if e['op'] == 'iteration' else 'actor insert'} {100 * e['share']:.1f}% "
                     f"(Amdahl at {e['at']}: {e['amdahl']:.2f}x)" for e in shares)
    body = [[f"{c['actors']}A+{c['learners']}L", f"{c['measured']:,.3g}", f"{c['predicted']:,.3g}",
             f"{100 * c['error']:+.0f}%", c["term"], "input" if c["input"] else ""] for c in cells]
    predicted = [c for c in cells if not c["input"]]
    within = sum(abs(c["error"]) <= serial_share.MISS for c in predicted)
    return ([f"  serial shares (one worker): {text}",
             f"  serial-share model on {cores} cores: {within} of {len(predicted)} predicted cells within "
             f"{100 * serial_share.MISS:.0f}%; a miss names the account that moved furthest"]
            + ["  " + line for line in format_table(["split", "measured/s", "predicted/s", "error", "missed term", ""],
                                                    body, {1, 2, 3})])


def _cmd(args) -> int:
    from replaybench.bench import contract

    cores = list(args.cores)
    bad = [n for n in cores if n < 2]
    if bad:
        args.parser.error(f"--cores: each core count must be >= 2 (an actor and a learner), got {bad}")
    bad = [n for n in cores if n > MAX_CORES]
    if bad:
        args.parser.error(f"--cores: each core count must be at most {MAX_CORES:,} (a plan for one machine), "
                          f"got {bad}")
    try:
        meta = contract.read_meta(args.run)
        rows = contract.read_rows(args.run)
    except (contract.RunError, OSError) as err:
        print(f"error: --run {args.run}: {err}", file=sys.stderr)
        return 1
    machine = (meta.get("machine") or {}).get("usable_cpus")
    try:
        print(format_plan(rows, cores, int(machine) if machine else None))
    except ValueError as err:
        print(f"error: --run {args.run}: {err}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    from replaybench.bench import arguments

    p = sub.add_parser("plan", help="scaling model of a concurrency run: predicted vs measured, best split per core count")
    p.add_argument("--run", required=True, help="a concurrency run folder (results/<run_id>)")
    p.add_argument("--cores", type=arguments.csv(int), default=list(DEFAULT_CORES),
                   help="comma-separated core counts to plan for (default 4,8,16,32,64)")
    p.set_defaults(func=_cmd, parser=p)
