"""Table 1's accuracy / speed frontier: every row's accuracy against its measured speed-up over
the base and against its counted compute, one marker per family, K joined within a family.

Matched layer calls are not matched wall time (a cache's selection, gathers and scatters cost
time no layer call counts), so the two panels are drawn side by side."""

from __future__ import annotations

from tadm.registry import DG_CACHES

FAMILY_NAMES = {"base": "Base", "control": "Control (fresh anchor)", "tadm": "TADM (trained fusion)"}
MARKERS = {"base": "s", "control": "D", "tadm": "o"}


def legend(family: str) -> tuple[str, str]:
    """(legend name, marker) of a row family: the base, the control, TADM, or a training-free
    cache of `tadm.registry.DG_CACHES` (its entry's)."""
    cache = DG_CACHES.get(family)
    if cache is not None:
        return cache.legend, cache.marker
    return FAMILY_NAMES.get(family, family), MARKERS.get(family, "o")


def frontier_figure(df):
    """One row of panels per task of `df` (:func:`tadm.experiments.table1_render.frame`): accuracy (± sd
    over seeds; TADM K >= 2 and the control: the mean over fusion runs ± one run's sd over them)
    against throughput x (± its bootstrap se), and against compute x."""
    import matplotlib  # lazy: matplotlib takes ~0.7 s to import; only drawing the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib takes ~0.7 s to import; only drawing the figure needs it

    tasks = list(dict.fromkeys(df.task))
    fig, axes = plt.subplots(len(tasks), 2, figsize=(10, 4 * len(tasks)), squeeze=False)
    for row, task in zip(axes, tasks):
        t = df[df.task == task]
        for family, g in t.groupby("family", sort=False):
            g = g.sort_values("compute_x", ascending=False)
            label, marker = legend(family)
            for ax, x, xerr in ((row[0], g.throughput_x, g.throughput_se.fillna(0.0)), (row[1], g.compute_x, None)):
                ax.errorbar(x, g.accuracy, yerr=g.sd, xerr=xerr, marker=marker, ls="--", lw=1,
                            capsize=2, label=label)
                for xi, yi, k in zip(x, g.accuracy, g.refresh_every):
                    if k == k and k is not None:
                        ax.annotate(f"K={int(k)}", (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        row[0].set_xlabel("Throughput over the base (paired, measured)")
        row[1].set_xlabel("Decoder-layer calls over the base (counted)")
        row[1].invert_xaxis()  # less compute to the right, as more speed on the left panel
        for ax in row:
            ax.set_ylabel(f"{task}: accuracy (%)")
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle("Table 1: accuracy against speed (left) and compute (right); error bars: sd over seeds "
                 "(trained rows: over fusion runs), se of the speed-up")
    fig.tight_layout()
    return fig
