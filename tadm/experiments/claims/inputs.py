"""What the claims read: the pipeline's outputs under a run's root (`read_inputs`) and this
profile's budgets, held as `Inputs`, with the per-sample scores of Table 2's rows and of their
training replicates' draws, each draw's cell and the between-run variance pooled over the
replicated rows.

Every number a verdict reads passes through `Inputs` and is kept in its record: the JSON outputs
whole (Table 1, the throughput stage, the sweep, the staleness summary, the training and evaluator
metrics) and, of the per-sample arrays, only what the claims compute from them (each draw's cell
and its within-run variance, the per-seed paired differences and their bootstrap variances, the
sweep's paired ratio, each draw's Gen PPL). `Inputs.to_json` writes that record
(paper_figures/claims_inputs.json, a few hundred KB) and `Inputs.from_json` reads it back as
`RecordedInputs`, which answers the same questions from the record alone: the claims recomputed
from it are byte-identical to the stage's (``python -m tadm claims --from FILE``)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from tadm.config import Params
from tadm.config.loader import from_dict
from tadm.errors import DataError
from tadm.experiments.table2 import load_paired
from tadm.io import json_loads, read_regular_text
from tadm.losses import ar_nll
from tadm.metrics.bootstrap import paired_log_ppl_ratio, paired_mauve_diff, resamples, spread
from tadm.metrics.mauve import mauve_score_features
from tadm.metrics.replicates import Pooled, pooled_between
from tadm.models.loading import load_pretrained
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
    record: dict = field(default_factory=dict)  # key -> what a per-sample computation gave (to_json)

    def _kept(self, key: str, compute):
        """`compute()`'s result under `key`, computed once and kept in the record."""
        if key not in self.record:
            self.record[key] = compute()
        return self.record[key]

    def seeds(self, row: str, T: int | None) -> list[int]:
        """The training runs (seeds) `row` was drawn from at T (`draws`)."""
        return self._kept(f"seeds/{row}/{T}", lambda: sorted(self.draws(row, T)))

    def paired_diffs(self, metric: str, a_row: str, b_row: str, T: int) -> dict:
        """a - b in `metric` per training run both rows were drawn from: {"n": samples of the
        tables' run, "per_seed": {seed: (difference, its paired-bootstrap variance)}} ("mauve":
        MAUVE(a) - MAUVE(b) on the shared references; "log_ppl": log(PPL a / PPL b))."""
        def compute():
            A, B = self.draws(a_row, T), self.draws(b_row, T)
            B_ = self.params.eval.bootstrap
            per = {}
            for s in sorted(set(A) & set(B)):
                a, b = A[s], B[s]
                if metric == "mauve":
                    d, se = paired_mauve_diff(a["reference"], a["features"], b["features"], B_)
                else:
                    d, se = paired_log_ppl_ratio(a["nll"], a["tokens"], b["nll"], b["tokens"], B_)
                per[s] = (d, se * se)
            main = self.params.seed if self.params.seed in A else (min(A) if A else None)
            return {"n": len(A[main]["nll"]) if main is not None else 0, "per_seed": per}

        return self._kept(f"paired_diffs/{metric}/{a_row}/{b_row}/{T}", compute)

    def paired_ratio(self, a_dir: str, b_dir: str, T: int) -> tuple[float, float, int] | None:
        """log(PPL a / PPL b) of two sample directories of one model (paired bootstrap over
        samples): (value, se, n), None when either is missing."""
        def compute():
            a, b = self.paired(a_dir, T), self.paired(b_dir, T)
            if a is None or b is None:
                return None
            v, se = paired_log_ppl_ratio(a["nll"], a["tokens"], b["nll"], b["tokens"], self.params.eval.bootstrap)
            return v, se, len(a["nll"])

        return self._kept(f"paired_ratio/{a_dir}/{b_dir}/{T}", compute)

    def ar_ppl(self, row: str, T: int) -> float | None:
        """The AR model's perplexity of `row`'s samples at T (the tables' run: samples/<row>/T<T>.npy,
        scored by models/ar: exp of the mean next-token NLL over every position after the first),
        a second judge's view of the same cell; None when the samples or the AR model are absent."""

        def compute():
            path, model_dir = self.root / "samples" / row / f"T{T}.npy", self.root / "models" / "ar"
            if not path.is_file() or not (model_dir / "config.json").is_file():
                return None
            if "ar_model" not in self._pools:
                self._pools["ar_model"] = load_pretrained(model_dir)
            model = self._pools["ar_model"]
            x = torch.from_numpy(np.load(path, allow_pickle=False)).long()
            if x.ndim != 2 or not 2 <= x.shape[1] <= model.seq_len or int(x.max()) >= model.vocab_size:
                return None  # not a token canvas the AR model reads (e.g. mask ids left)
            nll = 0.0
            with torch.no_grad():
                for chunk in x.split(64):
                    nll += float(ar_nll(model(chunk), chunk).sum())
            return math.exp(nll / (x.shape[0] * (x.shape[1] - 1)))

        return self._kept(f"ar_ppl/{row}/{T}", compute)

    def gen_ppl(self, row: str, T: int) -> dict[int, float]:
        """seed -> Gen PPL of `row`'s draw at T (exp of the mean NLL per token)."""
        return self._kept(f"gen_ppl/{row}/{T}", lambda: {
            s: math.exp(float(np.sum(d["nll"]) / np.sum(d["tokens"]))) for s, d in self.draws(row, T).items()})

    def to_json(self) -> str:
        """Every number the claims read (the module docstring), as JSON text."""
        data = {"format": 1, "params": asdict(self.params), "table2": self.table2, "sweep": self.sweep,
                "compute_column": self.compute_column, "table1": self.table1, "staleness": self.staleness,
                "train": self.train, "evaluator": self.evaluator, "throughput": self.throughput,
                "record": {k: _encode(v) for k, v in sorted(self.record.items())}}
        return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=True) + "\n"

    @staticmethod
    def from_json(path: str | Path) -> "RecordedInputs":
        """The `Inputs` a claims stage recorded in `path` (`to_json`)."""
        path = Path(path)
        try:
            data = json_loads(read_regular_text(path, 64 * 2 ** 20))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("record"), dict):
            raise DataError(f"{path}: not a claims inputs file (format 1 with a record); write one with "
                            "python -m tadm claims")
        p = from_dict(data["params"], f"{path} (params)")
        return RecordedInputs(p, data["table2"], data["sweep"], data["compute_column"], data["table1"],
                              data["staleness"], data["train"], data["evaluator"], data["throughput"], path.parent,
                              record={k: _decode(k, v) for k, v in data["record"].items()})

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
        return self.params.sample.refresh_every(T)

    def paired(self, samples_dir: str | Path, T: int | None) -> dict | None:
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
        T in every draw (`draws`), kept in the record."""
        return self._kept(f"cells/{metric}/{row}/{T}", lambda: {
            s: _cell_stat(metric, d, self.params.eval.bootstrap) for s, d in self.draws(row, T).items()})

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


class RecordedInputs(Inputs):
    """`Inputs` read back from a claims inputs file: every per-sample question is answered from the
    record; one it does not hold is a DataError (the file predates the question)."""

    def _kept(self, key: str, compute):
        if key not in self.record:
            raise DataError(f"claims inputs: no recorded {key!r} (the file was written by another version of "
                            "the claims; rerun python -m tadm claims on the run)")
        return self.record[key]

    def draws(self, row: str, T: int | None) -> dict[int, dict]:
        raise DataError("claims inputs: the per-sample arrays are not in the record")

    def paired(self, samples_dir, T):
        raise DataError("claims inputs: the per-sample arrays are not in the record")


def _encode(v):
    """A record value as JSON (seed keys as strings, tuples as lists)."""
    if isinstance(v, dict):
        return {str(k): _encode(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [_encode(x) for x in v]
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def _decode(key: str, v):
    """A record value as `Inputs` computed it (the inverse of `_encode` for each kind of key)."""
    kind = key.split("/", 1)[0]
    if kind == "seeds":
        return [int(s) for s in v]
    if kind == "cells":
        return {int(s): tuple(x) for s, x in v.items()}
    if kind == "paired_diffs":
        return {"n": v["n"], "per_seed": {int(s): tuple(x) for s, x in v["per_seed"].items()}}
    if kind == "paired_ratio":
        return None if v is None else tuple(v)
    if kind == "gen_ppl":
        return {int(s): x for s, x in v.items()}
    if kind == "ar_ppl":
        return v
    raise DataError(f"claims inputs: unknown record {key!r}")


def _cell_stat(metric: str, d: dict, B: int) -> tuple[float, float]:
    """(value, within-run variance) of one draw's cell: MAUVE against the references (the
    variance over resamples of the samples, the references fixed: every run shares them) or the
    log Gen PPL (over resamples of the samples)."""
    n = len(d["nll"])
    idx = resamples(n, max(B, 2))
    if metric == "mauve":
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
    # every trained model's metrics, the training replicates' too (named <model>-s<seed>): the
    # preconditions check each run a finding's effect averages over
    train = {f.stem: json.loads(f.read_text()) for f in sorted((root / "metrics" / "train").glob("*.json"))
             if f.stem != "jobs"}
    train |= {f.stem: json.loads(f.read_text()) for f in sorted((root / "metrics" / "train" / "replicates").glob("*.json"))}
    train = dict(sorted(train.items()))  # by name, as claims_inputs.json keeps them: the recomputation's order
    return Inputs(p, table2, sweep, _json(root / "metrics" / "compute_column.json"), _json(root / "results" / "table1.json"),
                  staleness, train, _json(root / "metrics" / "evaluator.json"), _json(root / "results" / "throughput.json"),
                  root)

