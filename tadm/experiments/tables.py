"""The paper's tables and figures from the JSON results the sampling stages wrote.

    results/table2/<row>.json   one Table 2 row, every budget T   (tadm.experiments.table2.run_row)
    results/sweep/<name>.json   TADM at one T with refresh K (or the adaptive policy)
    results/throughput.json     Table 2's tokens/s: timing blocks in separate processes, every row
                                timed in turns in each (tadm.experiments.throughput_results; `read_throughput`)

`table2_frame` / `sweep_frame` flatten them into pandas frames; `write_table` writes Markdown
and CSV; `tradeoff_figure` plots quality against compute (seaborn), saved as PNG and PDF.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from tadm.errors import DataError
from tadm.experiments import throughput_results
from tadm.experiments.table2 import ROWS
from tadm.experiments.throughput_results import paired_ratio, row_tokens_per_s
from tadm.io import atomic_path, atomic_write_text

METRICS = ["mauve", "gen_ppl", "entropy", "layer_calls", "tokens_per_s"]
# each metric's bootstrap uncertainty (tadm.metrics.bootstrap), shown as "value ± se" in Markdown
SE = {"mauve": "mauve_se", "gen_ppl": "gen_ppl_se", "entropy": "entropy_se", "tokens_per_s": "tokens_per_s_se",
      "throughput_vs_adlm": "throughput_vs_adlm_se"}
HEADERS = {"mauve": "MAUVE ↑", "gen_ppl": "Gen PPL ↓", "entropy": "Entropy", "layer_calls": "Compute (layer calls)",
           "tokens_per_s": "Throughput (tok/s)", "compute_vs_mdlm": "Compute vs MDLM",
           "throughput_vs_adlm": "Throughput vs ADLM"}


def read_results(directory: str | Path) -> list[dict]:
    files = sorted(Path(directory).glob("*.json"))
    if not files:

        raise DataError(f"no results in {directory}: run the sampling stages first")
    return [json.loads(f.read_text()) for f in files]


def read_throughput(path: str | Path = "results/throughput.json") -> dict:
    """The throughput stage's result; a one-line DataError naming the file when it is missing."""

    return throughput_results.load(path)


def with_throughput(df: pd.DataFrame, throughput: dict, source: str = "results/throughput.json") -> pd.DataFrame:
    """`df` (a `long_frame`) with tokens/s (± se) and throughput_vs_adlm (± se) from the throughput
    stage instead of each row stage's own timing: across its timing blocks, the geometric mean of
    the blocks' tokens/s and exp(mean of the blocks' log ratios) ± their se over the blocks
    (`tadm.experiments.throughput_results.paired_ratio`). A Table 2 row that samples
    but was not timed there is a DataError (a stale results/throughput.json), never the row's own
    number; rows without a model (Data) get none."""

    cells = []  # (tokens/s, its se, ratio vs ADLM, its se) per line of df
    for name, T in zip(df.row, df["T"]):
        timed = throughput["budgets"].get(str(int(T)), {}).get("rows", {}).get(name)
        if timed is None:
            if name in ROWS and ROWS[name].model is not None:
                raise DataError(f"{source} has no row {name!r} at T={int(T)}: rerun the throughput stage "
                                "(`dvc repro throughput`)")
            cells.append((None, None, None, None))
            continue
        try:
            ratio, se = paired_ratio(throughput, int(T), name, "adlm")
        except KeyError:  # ADLM not timed
            ratio = se = None
        cells.append((*row_tokens_per_s(timed), ratio, se))
    df = df.copy()
    columns = ["tokens_per_s", "tokens_per_s_se", "throughput_vs_adlm", "throughput_vs_adlm_se"]
    for j, column in enumerate(columns):
        df[column] = [c[j] for c in cells]
    return df


def long_frame(results: list[dict]) -> pd.DataFrame:
    """One line per (row, T) with every metric."""
    lines = []
    for r in results:
        for T, m in r["budgets"].items():
            lines.append({"row": r["row"], "label": r["label"], "T": int(T), "policy": m.get("policy"),
                          "sampler": m.get("sampler"), **{k: m.get(k) for k in METRICS},
                          **{SE[k]: m.get(SE[k]) for k in METRICS if k in SE}})
    return pd.DataFrame(lines)


def table2_frame(results: list[dict], throughput: dict) -> pd.DataFrame:
    """Table 2: rows in the paper's order, (metric, T) columns, compute also relative to MDLM
    and throughput relative to ADLM at the same T (the paper's normalisation: its 1.73x).
    Tokens/s and the ratio come from `throughput` (results/throughput.json, `read_throughput`):
    every row timed in turns in one process, the ratio the median of paired per-round ratios."""
    df = with_throughput(long_frame(results), throughput)
    mdlm = df[df.row == "mdlm"].set_index("T")["layer_calls"]
    df["compute_vs_mdlm"] = [lc / mdlm[T] if lc is not None and T in mdlm.index else None
                             for lc, T in zip(df.layer_calls, df["T"])]
    order = [r for r in ROWS if r in set(df.row)] + sorted(set(df.row) - set(ROWS))
    values = METRICS + ["compute_vs_mdlm", "throughput_vs_adlm"]
    wide = df.pivot(index="row", columns="T", values=values + [SE[k] for k in values if k in SE])
    wide = wide.reindex(order)
    wide.index = [ROWS[r].label if r in ROWS else r for r in wide.index]
    wide.index.name = "Method"
    return wide


def sweep_frame(results: list[dict]) -> pd.DataFrame:
    """The refresh-interval sweep: one line per policy at one T, compute relative to K = 1."""
    df = long_frame(results)
    base = df[df.policy == "FixedInterval(K=1)"].set_index("T")["layer_calls"]
    df["compute_vs_k1"] = [lc / base[T] if T in base.index else None for lc, T in zip(df.layer_calls, df["T"])]
    df["order"] = [(0, int(p.split("=")[1].rstrip(")"))) if p.startswith("FixedInterval") else (1, p)
                   for p in df.policy.astype(str)]
    df["policy"] = [policy_label(p) for p in df.policy.astype(str)]
    return df.sort_values(["T", "order"]).drop(columns=["order", "label", "row"]).reset_index(drop=True)


def policy_label(policy: str) -> str:
    """"FixedInterval(K=4)" -> "K=4"; "AdaptiveDrift(threshold=0.2, metric='changed_fraction', ...)"
    -> "adaptive: changed_fraction > 0.2"."""
    if policy.startswith("FixedInterval("):
        return policy.removeprefix("FixedInterval(").rstrip(")")
    if policy.startswith("AdaptiveDrift("):
        fields = dict(f.split("=") for f in policy.removeprefix("AdaptiveDrift(").rstrip(")").split(", "))
        return f"adaptive: {fields['metric'].strip(chr(39))} > {fields['threshold']}"
    return policy


def metrics_dict(results: list[dict], throughput: dict | None = None) -> dict[str, float]:
    """Flat {"<row>_T<T>_<metric>": value} for `dvc metrics` (missing values left out); with
    `throughput` (results/throughput.json) tokens/s and throughput_vs_adlm are the throughput stage's."""
    out = {}
    df = long_frame(results)
    metrics = ["mauve", "gen_ppl", "entropy", "layer_calls", "tokens_per_s"]
    if throughput is not None:
        df, metrics = with_throughput(df, throughput), metrics + ["throughput_vs_adlm"]
    for r in df.itertuples():
        for m in metrics:
            v = getattr(r, m)
            if v is not None and not pd.isna(v):
                out[f"{r.row}_T{r.T}_{m}"] = float(v)
    return out


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    if isinstance(v, float):
        if v != 0 and abs(v) < 1e-2:
            return f"{v:.2e}"
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def to_markdown(df: pd.DataFrame) -> str:
    """A pipe table without the `tabulate` dependency (MultiIndex columns joined as "metric T=..")."""
    cols = [" ".join([HEADERS.get(str(c[0]), str(c[0])), f"T={c[1]}"]) if isinstance(c, tuple) else HEADERS.get(c, c)
            for c in df.columns]
    index_name = df.index.name or ""
    lines = ["| " + " | ".join([index_name, *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for idx, row in df.iterrows():
        lines.append("| " + " | ".join([_fmt(idx), *(_fmt(v) for v in row.tolist())]) + " |")
    return "\n".join(lines) + "\n"


def _pm(value, se) -> str:
    """"value ± se", both to the decimals the uncertainty supports (2 significant digits of se)."""
    if value is None or pd.isna(value):
        return "–"
    if se is None or pd.isna(se):
        return _fmt(value)

    decimals = max(0, 1 - int(math.floor(math.log10(se)))) if se > 0 else 3
    return f"{value:,.{decimals}f} ± {se:,.{decimals}f}"


def with_uncertainty(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each metric that has an uncertainty column (SE) shown as "value ± se" and the
    uncertainty columns dropped (columns may be metric names or (metric, T) tuples)."""
    out = df.copy()
    for col in df.columns:
        metric = col[0] if isinstance(col, tuple) else col
        se_col = ((SE[metric], *col[1:]) if isinstance(col, tuple) else SE[metric]) if metric in SE else None
        if se_col is not None and se_col in df.columns:
            out[col] = [_pm(v, e) for v, e in zip(df[col], df[se_col])]
    return out.drop(columns=[c for c in df.columns if (c[0] if isinstance(c, tuple) else c) in SE.values()])


def write_table(df: pd.DataFrame, out: str | Path, name: str, caption: str = "") -> None:
    """<out>/<name>.md (metrics with their uncertainty as "value ± se") and <name>.csv (every
    column as a number)."""
    out = Path(out)
    atomic_write_text(out / f"{name}.md", (f"{caption}\n\n" if caption else "") + to_markdown(with_uncertainty(df)))
    atomic_write_text(out / f"{name}.csv", df.to_csv())


def save_figure(fig, out: str | Path, name: str) -> None:
    """PNG (150 dpi) and PDF, each written atomically."""
    for ext in ("png", "pdf"):
        with atomic_path(Path(out) / f"{name}.{ext}") as tmp:
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight")


def tradeoff_figure(table2: list[dict], sweep: list[dict] | None = None):
    """Quality (Gen PPL, MAUVE) against compute (layer calls per sequence batch), every row and
    budget; the TADM refresh sweep as a connected line."""
    import matplotlib  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them
    import seaborn as sns  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them

    full = long_frame(table2)
    df = full.dropna(subset=["layer_calls"])
    data = full[full.row == "data"]
    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("gen_ppl", "mauve")):
        if len(data):
            ax.axhline(float(data[metric].iloc[0]), color="k", ls="--", lw=1, label="Data (held-out text)")
        sns.scatterplot(data=df, x="layer_calls", y=metric, hue="label", style="T", s=70, ax=ax)
        if sweep:
            sw = long_frame(sweep)
            fixed = sw[sw.policy.astype(str).str.startswith("FixedInterval")].sort_values("layer_calls")
            fixed = fixed.assign(policy=[policy_label(p) for p in fixed.policy])
            ax.plot(fixed.layer_calls, fixed[metric], "-o", color="0.4", ms=3, lw=1, label="TADM, K = 1..8")
            for _, r in fixed.iterrows():
                ax.annotate(r.policy.removeprefix("K="), (r.layer_calls, r[metric]), fontsize=7,
                            xytext=(2, 2), textcoords="offset points")
        ax.set_xlabel("Transformer-layer calls per sequence batch")
        ax.set_ylabel(HEADERS[metric])
        if metric == "gen_ppl":
            ax.set_yscale("log")
    axes[0].get_legend().remove()
    axes[1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle("Quality against compute")
    fig.tight_layout()
    return fig


__all__ = ["read_results", "read_throughput", "with_throughput", "long_frame", "metrics_dict", "table2_frame", "sweep_frame", "to_markdown", "write_table", "save_figure",
           "tradeoff_figure"]


def replicate_runs_frame(table2: list[dict], replicates: list[dict], seed: int) -> pd.DataFrame:
    """One line per (row, T, training run) of the rows drawn from training replicates
    (results/replicates/<row>-s<seed>.json, `tadm.experiments.replicates`) -- the tables' own run
    (`seed`, from `table2`) and every replicate -- with MAUVE, Gen PPL and entropy."""
    main = {r["row"]: r for r in table2}
    lines = []
    for r in replicates:
        for T, m in r["budgets"].items():
            for s, cell in ((seed, main.get(r["row"], {}).get("budgets", {}).get(T)), (r["seed"], m)):
                if cell is not None:
                    lines.append({"row": r["row"], "label": ROWS[r["row"]].label, "T": int(T), "seed": s,
                                  **{k: cell.get(k) for k in ("mauve", "gen_ppl", "entropy")}})
    return pd.DataFrame(lines).drop_duplicates(["row", "T", "seed"]).sort_values(["row", "T", "seed"]).reset_index(drop=True)


def replicate_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (row, T): the training runs' count and each metric's mean and sd over them (Gen PPL:
    the geometric mean and the sd of log Gen PPL, the scale the findings test on)."""

    out = []
    for (row, T), g in runs.groupby(["row", "T"], sort=False):
        logs = np.log(g.gen_ppl.astype(float))
        out.append({"Method": ROWS[row].label, "T": T, "runs": len(g), "seeds": ", ".join(map(str, g.seed)),
                    "mauve": g.mauve.mean(), "mauve_sd": g.mauve.std(ddof=1),
                    "gen_ppl": float(np.exp(logs.mean())), "log_gen_ppl_sd": logs.std(ddof=1),
                    "entropy": g.entropy.mean(), "entropy_sd": g.entropy.std(ddof=1)})
    return pd.DataFrame(out).set_index("Method")


def write_replicates(runs: pd.DataFrame | None, out: str | Path, name: str = "table2_runs", caption: str = "") -> None:
    """<out>/<name>.md (mean ± sd over training runs per row and T) and <name>.csv (every run);
    `runs` None (no training replicates): files that say so."""
    if runs is None:
        atomic_write_text(Path(out) / f"{name}.md", (f"{caption}\n\n" if caption else "")
                          + "No training replicates at this profile (train.replicates = 1).\n")
        atomic_write_text(Path(out) / f"{name}.csv", "row,label,T,seed,mauve,gen_ppl,entropy\n")
        return
    s = replicate_summary(runs)
    md = s[["T", "runs", "seeds"]].copy()
    md["MAUVE ↑ (mean ± sd)"] = [_pm(v, e) for v, e in zip(s.mauve, s.mauve_sd)]
    md["Gen PPL ↓ (geometric mean, sd of log)"] = [f"{v:,.1f} (± {e:.3f})" for v, e in zip(s.gen_ppl, s.log_gen_ppl_sd)]
    md["Entropy (mean ± sd)"] = [_pm(v, e) for v, e in zip(s.entropy, s.entropy_sd)]
    atomic_write_text(Path(out) / f"{name}.md", (f"{caption}\n\n" if caption else "") + to_markdown(md))
    atomic_write_text(Path(out) / f"{name}.csv", runs.to_csv(index=False))
