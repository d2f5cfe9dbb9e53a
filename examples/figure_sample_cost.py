"""A figure in one file (docs/extending.md): nanoseconds per sampled transition against
capacity, one line per variant. As a module of analysis/plots/ ``make plots`` finds it, draws
it and writes the ``data`` it returns as the CSV beside the PNG.

    python examples/figure_sample_cost.py        # draws the committed reference runs
"""

from matplotlib.figure import Figure

from replaybench.analysis import load, palette, stats
from replaybench.analysis.plots import NoRows, Plot

NAME = "sample_cost"
ORDER = 90
TITLE = "Sample cost per transition"


def build(table, metas) -> Plot:
    plain = [run for run, meta in metas.items() if not stats.grid_keys(meta)]  # runs that swept no parameter
    micro = table[table["run_id"].isin(plain) & (table["scenario"] == "micro")]  # not another scenario's samples
    rows = stats.timings(load.latest_per_cell(micro))  # ok timings, newest run
    rows = rows[rows["op"] == "sample"]
    if rows.empty:
        raise NoRows("no sample timings (replaybench run --suite micro)")
    data = stats.spread(rows, ["variant", "capacity"], "ns_per_item")
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    for variant, line in data.groupby("variant"):
        line = line.sort_values("capacity")
        x, med = line["capacity"].to_numpy(float), line["median"].to_numpy(float)
        err = [med - line["min"].to_numpy(float), line["max"].to_numpy(float) - med]
        ax.errorbar(x, med, yerr=err, marker="o", color=palette.variant_colour(variant), label=variant)
    ax.set(xscale="log", yscale="log", xlabel="capacity (transitions)", ylabel="ns per sampled transition")
    ax.legend(fontsize=7)
    return Plot(fig, data, "Median ns per sampled transition (bars: min-max) against capacity, per variant.")


def main(runs=None) -> Plot:
    """Build the figure from ``runs`` (default: the committed results/reference-micro)."""
    from pathlib import Path

    res = load.load_runs(runs or [Path(__file__).resolve().parents[1] / "results" / "reference-micro"])
    plot = build(res.table, res.metas)
    print(plot.data.head().to_string())
    return plot


if __name__ == "__main__":
    main()
