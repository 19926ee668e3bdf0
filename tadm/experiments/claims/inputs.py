"""What the claims read: the pipeline's outputs under a run's root (`read_inputs`) and this
profile's budgets, held as `Inputs`, with the per-sample scores of Table 2's rows and of their
training replicates' draws, each draw's cell and the between-run variance pooled over the
replicated rows."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tadm.config import Params
from tadm.metrics.bootstrap import resamples, spread
from tadm.metrics.replicates import Pooled, pooled_between
from tadm.train.trainer import seeds_after


@dataclass
class Inputs:
    params: Params
    table2: dict[str, dict]  # row -> result
    sweep: list[dict]
    compute_column: dict | None
    table1: dict | None
    staleness: list[dict] | None
    train: dict[str, dict]
    evaluator: dict | None
    throughput: dict | None = None
    root: Path = Path(".")
    _pools: dict = field(default_factory=dict)

    def cell(self, row: str, T: int | None) -> dict | None:
        r = self.table2.get(row)
        if r is None or T is None:
            return None
        return r["budgets"].get(str(T))

    def budget(self, multiple: int) -> int | None:
        """This profile's T = multiple x L (None when it is not a sampling budget)."""
        T = multiple * self.params.sample.canvas_length
        return T if T in self.params.sample.steps else None

    def refresh(self, T: int | None) -> int | None:
        """This profile's refresh interval K at budget T."""
        if T is None:
            return None
        return self.params.sample.refresh_for(T)

    def paired(self, samples_dir: str | Path, T: int | None) -> dict | None:
        from tadm.experiments.table2 import load_paired

        return None if T is None else load_paired(self.root / samples_dir, T)

    def draws(self, row: str, T: int | None) -> dict[int, dict]:
        """seed -> per-sample scores of `row` at T: the tables' run (samples/<row>) and every
        training replicate's draw (samples/replicates/s<seed>/<row>) present."""
        p = self.params
        out = {}
        main = self.paired(f"samples/{row}", T)
        if main is not None:
            out[p.seed] = main
        if row in p.sample.replicate_rows and T in p.sample.replicate_steps:
            for seed in seeds_after(p.seed, p.train.replicates):
                d = self.paired(Path("samples") / "replicates" / f"s{seed}" / row, T)
                if d is not None:
                    out[seed] = d
        return out

    def cells(self, metric: str, row: str, T: int) -> dict[int, tuple[float, float]]:
        """seed -> (value, within-run variance) of `row`'s `metric` cell ("mauve", "log_ppl") at
        T in every draw (`draws`), cached."""
        key = ("cells", metric, row, T)
        if key not in self._pools:
            self._pools[key] = {s: _cell_stat(metric, d, self.params.eval.bootstrap) for s, d in self.draws(row, T).items()}
        return self._pools[key]

    def pool(self, metric: str, T: int) -> Pooled | None:
        """The between-run variance of `metric` ("mauve", "log_ppl") cells at T, pooled over the
        replicated rows that were drawn at least twice (None: none was)."""
        key = ("pool", metric, T)
        if key not in self._pools:
            runs, within = [], []
            for row in self.params.sample.replicate_rows:
                cells = self.cells(metric, row, T)
                if len(cells) >= 2:
                    runs.append([v for v, _ in cells.values()])
                    within.append([w for _, w in cells.values()])
            self._pools[key] = pooled_between(runs, within) if runs else None
        return self._pools[key]


def _cell_stat(metric: str, d: dict, B: int) -> tuple[float, float]:
    """(value, within-run variance) of one draw's cell: MAUVE against the references (the
    variance over resamples of the samples, the references fixed: every run shares them) or the
    log Gen PPL (over resamples of the samples)."""
    n = len(d["nll"])
    idx = resamples(n, max(B, 2))
    if metric == "mauve":
        from tadm.metrics.mauve import mauve_score_features

        ref, feats = d["reference"], d["features"]
        return (mauve_score_features(ref, feats),
                spread([mauve_score_features(ref, feats[i]) for i in idx]) ** 2)
    nll, tok = np.asarray(d["nll"], np.float64), np.asarray(d["tokens"], np.float64)
    return float(nll.sum() / tok.sum()), spread(nll[idx].sum(1) / tok[idx].sum(1)) ** 2


def _json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def read_inputs(p: Params, root: Path = Path(".")) -> Inputs:
    table2 = {}
    for f in sorted((root / "results" / "table2").glob("*.json")):
        r = json.loads(f.read_text())
        table2[r["row"]] = r
    sweep = [json.loads(f.read_text()) | {"_name": f.stem} for f in sorted((root / "results" / "sweep").glob("*.json"))]
    stale = root / "paper_figures" / "anchor_staleness.csv"
    staleness = list(csv.DictReader(io.StringIO(stale.read_text()))) if stale.is_file() else None
    train = {f.stem: json.loads(f.read_text()) for f in sorted((root / "metrics" / "train").glob("*.json"))}
    return Inputs(p, table2, sweep, _json(root / "metrics" / "compute_column.json"), _json(root / "results" / "table1.json"),
                  staleness, train, _json(root / "metrics" / "evaluator.json"), _json(root / "results" / "throughput.json"),
                  root)

