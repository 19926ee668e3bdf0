"""Table 2 (unconditional generation): the rows, how each is sampled, and how samples are scored.

Rows (paper Table 2; the sampler each one uses):

    data          held-out validation sequences (no model): where real text sits
    ar            AR, left to right after BOS, top-p
    sedd          SEDD, its analytic sampler
    mdlm          MDLM, ancestral
    mdlm_fb       MDLM + the forward-backward corrector
    mdlm_dfm      MDLM + the DFM corrector
    remdm         MDLM's model sampled with ReMDM-loop
    adlm          ADLM, ReMDM-loop
    tadm_gamma0   TADM-dagger (gamma = 0), ReMDM-loop, anchor refreshed every K (sample.budgets)
    tadm          TADM-double-dagger (gamma = train.gamma), the same
    tadm_nofusion TADM-double-dagger's model with the fusion bypassed: the same anchor
                  cache and K, but the denoiser reads the cached anchor as is, D(h), never the
                  current canvas between refreshes (`TADMAdapter(bypass_fusion=True)`)

Scoring (`Scorer`, in `tadm.metrics.scorer`): MAUVE against `eval.reference_samples` held-out validation sequences (the
first ones; the Data row takes the next `sample.num_samples`), Gen PPL with the evaluator
(`tadm.metrics.gen_ppl`), mean per-sample token entropy of the model's own token ids, and from
the sampling record: Transformer-layer calls per generated sequence batch (the compute column)
and tokens/s over every generated position.

Where it runs: one `tadm.runtime.Dist` (from `runtime.setup(params.runtime)`; notebooks override
runtime.device / runtime.precision) for sampling and scoring. The evaluator is loaded once, in
bf16 on a GPU (runtime.precision bf16) and fp32 on the CPU, where it also runs without autocast
even on a CPU with native bf16 (`Scorer.autocast`); when it is also the featurizer
(eval.featurizer == eval.evaluator: smollm2 / smollm2, gpt2-large / gpt2-large) one forward pass
gives Gen PPL and the MAUVE features (`gen_ppl_and_features`). The reference features are
computed once and cached under eval.cache_dir (`Scorer.reference_cache_path`), so every row and
the sweep reuse them. With runtime.nproc > 1, `run_row` / `run_sweep` relaunch themselves as
`python -m torch.distributed.run ... -m tadm.experiments.jobs` (`tadm.experiments.worker.launch`):
sampling batches and scoring batches are split over the processes, which give the same samples
and scores as one process (`tadm.experiments.sampling`, `tadm.metrics.shards`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from tadm.config import Params
from tadm.data.tokenizer import load_tokenizer
from tadm.errors import ConfigError
from tadm.experiments import worker
from tadm.experiments.sampling import SampleRun, draw_samples, reusable_samples, save_samples, shared_record
from tadm.io import atomic_path, atomic_write_json
from tadm.methods import Row
from tadm.registry import TABLE2_ROWS
from tadm.metrics.scorer import Scorer, validation_tokens


class _Rows(Mapping[str, Row]):
    """Table 2's rows: Data, then every method unit's rows (`Method.rows`), in registration order;
    read when asked, so a unit registered later (a test's own method) has its rows here too."""

    DATA = Row("data", "Data", None)

    def _all(self) -> dict[str, Row]:
        return {"data": self.DATA, **{name: TABLE2_ROWS[name] for name in TABLE2_ROWS.names()}}

    def __getitem__(self, name: str) -> Row:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


ROWS: Mapping[str, Row] = _Rows()


def _job_scorer(p: Params, d, args: dict) -> Scorer:
    return Scorer(p, load_tokenizer(args["tokenizer"]), args["packed_dir"], dist=d)


def row_job(p: Params, d, args: dict) -> Any:
    """Worker job "row" (`tadm.experiments.worker`): :func:`run_row` in one torchrun process."""
    return run_row(args["name"], p, _job_scorer(p, d, args), **args["kwargs"])


def sweep_job(p: Params, d, args: dict) -> Any:
    """Worker job "sweep": :func:`run_sweep` in one torchrun process."""
    return run_sweep(args["row"], p, _job_scorer(p, d, args), **args["kwargs"])


def data_record(steps: int, start: int, count: int) -> dict[str, Any]:
    return {"row": "data", "T": steps, "sampler": "data", "policy": None, "counters": {}, "tokens_per_s": None,
            "source": f"data/packed/validation sequences {start}..{start + count - 1}"}


def save_data_samples(tokens: np.ndarray, out_dir: Path, steps: int, start: int) -> dict[str, Any]:
    """The Data row's "samples" (held-out validation sequences) saved like a model's, so every
    row of the table has its texts on disk."""
    record = data_record(steps, start, len(tokens))
    with atomic_path(Path(out_dir) / f"T{steps}.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, tokens.astype(np.int64), allow_pickle=False)
    atomic_write_json(Path(out_dir) / f"T{steps}.json", record)
    return record


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)


def save_gen_ppl(ppl, out_dir: Path, steps: int) -> None:
    """<out_dir>/T<steps>_gen_ppl.npy: (N, 2) float64, each sample's summed NLL (nats) and its
    number of scored evaluator tokens (its own PPL is exp(nll / tokens))."""
    _save_npy(Path(out_dir) / f"T{steps}_gen_ppl.npy", np.stack([ppl.nll, ppl.tokens.astype(np.float64)], axis=1))


def save_features(features: np.ndarray, reference: np.ndarray, out_dir: Path, steps: int) -> None:
    """<out_dir>/T<steps>_features.npy (N, d) and <out_dir>/reference_features.npy (the shared
    references'), float32: what a paired bootstrap of two rows' MAUVE difference resamples
    (`tadm.metrics.bootstrap.paired_mauve_diff`, the claims stage)."""
    _save_npy(Path(out_dir) / f"T{steps}_features.npy", np.asarray(features, np.float32))
    _save_npy(Path(out_dir) / "reference_features.npy", np.asarray(reference, np.float32))


def load_paired(samples_dir: str | Path, T: int) -> dict[str, np.ndarray] | None:
    """A row's saved per-sample scores at budget T: {"features", "reference", "nll", "tokens"}
    (None when a file is missing)."""
    d = Path(samples_dir)
    files = {"features": d / f"T{T}_features.npy", "reference": d / "reference_features.npy",
             "gen_ppl": d / f"T{T}_gen_ppl.npy"}
    if not all(f.is_file() for f in files.values()):
        return None
    g = np.load(files["gen_ppl"], allow_pickle=False)
    return {"features": np.load(files["features"], allow_pickle=False),
            "reference": np.load(files["reference"], allow_pickle=False), "nll": g[:, 0], "tokens": g[:, 1]}


def run_row(name: str, params: Params, scorer: Scorer, *, models_dir: str | Path = "models",
            samples_dir: str | Path = "samples", steps: list[int] | None = None, K: int | None = None,
            adaptive: float | None = None, checkpoint: str | None = None, sampler: str | None = None,
            out: str | Path | None = None, reuse_dir: str | Path | None = None) -> dict[str, Any]:
    """Sample (or, for Data, read) and score one row at every budget T (or `steps`); write
    `out` (JSON). `checkpoint` / `sampler` replace the row's model directory / sampler.
    `reuse_dir`: a samples directory (Table 2's) whose `<name>/T<T>` draw is taken instead of
    sampling again when it is exactly this run's draw (`sampling.reusable_samples`).

    Rows whose samples do not depend on T (Data, AR) are drawn and scored once and saved under
    every budget. With runtime.nproc > 1 (and not already under torchrun) the row runs in
    torchrun workers (`tadm.experiments.worker`) and this returns what they wrote."""
    too_large = [T for T in (steps or params.sample.steps) if K is not None and K > T]
    if too_large:  # before any work
        raise ConfigError("K", f"must be <= T ({too_large[0]}; a larger K refreshes only at the start, as K = "
                          f"{too_large[0]} does), got {K}", "sampling")
    kwargs = dict(models_dir=str(models_dir), samples_dir=str(samples_dir), steps=steps, K=K, adaptive=adaptive,
                  checkpoint=checkpoint, sampler=sampler, out=None if out is None else str(out),
                  reuse_dir=None if reuse_dir is None else str(reuse_dir))
    if worker.needs_launch(params, "row"):
        return worker.launch("row", params, {"name": name, **scorer.worker_args(), "kwargs": kwargs})
    d = scorer.dist
    row = ROWS[name] if name in ROWS else Row(name, name, name)  # an unlisted run: its own label, default sampler
    bos_id = scorer.tokenizer.bos_token_id
    budgets = list(steps or params.sample.steps)
    out_dir = Path(samples_dir) / name
    result: dict[str, Any] = {"row": name, "label": row.label, "budgets": {}}
    shared = None  # (tokens, record, metrics, ppl, features) of a row whose samples do not depend on T
    for T in budgets:
        if row.model is None:
            if shared is None:
                tokens = scorer.data_tokens()
                shared = (tokens, None, *scorer.score_samples(tokens))
            tokens, _, metrics, ppl, features = shared
            record = data_record(T, params.eval.reference_samples, len(tokens))
            if d.main:
                save_data_samples(tokens, out_dir, T, start=params.eval.reference_samples)
        elif shared is not None:  # AR: the samples of the first budget serve this one too
            tokens, first, metrics, ppl, features = shared
            record = shared_record(first, T)
            if d.main:
                save_samples(tokens, record, out_dir, T)
        else:
            spec = SampleRun(name, checkpoint or str(Path(models_dir) / row.model), sampler or row.sampler, K=K,
                             adaptive=adaptive, bypass_fusion=row.bypass_fusion)
            reused = reusable_samples(spec, params, T, Path(reuse_dir) / name, d) if reuse_dir is not None else None
            tokens, record = reused or draw_samples(spec, params, T, bos_id=bos_id, dist=d)
            if d.main:
                save_samples(tokens, record, out_dir, T)
            metrics, ppl, features = scorer.score_samples(tokens)
            if record["model_type"] == "ar":
                shared = (tokens, record, metrics, ppl, features)
        if d.main:
            save_gen_ppl(ppl, out_dir, T)
            save_features(features, scorer.reference_features, out_dir, T)
        counters = record.get("counters", {})
        result["budgets"][str(T)] = {
            **metrics, "T": T, "sampler": record["sampler"], "policy": record.get("policy"),
            "layer_calls": counters.get("layer_calls_per_trajectory"),
            "anchor_calls": counters.get("anchor_calls"),
            "flops_per_token": counters.get("flops_per_token"),
            "tokens_per_s": record.get("tokens_per_s"), "tokens_per_s_se": record.get("tokens_per_s_se"),
            "refreshes_per_trajectory": record.get("refreshes_per_trajectory"),
            "examples": scorer.texts(tokens[:2]),
        }
    if out is not None and d.main:
        atomic_write_json(out, result)
    return result


def run_sweep(row: str, params: Params, scorer: Scorer, *, T: int | None = None, K_values: list[int] | None = None,
              adaptive_thresholds: list[float] | tuple = (), models_dir: str | Path = "models",
              samples_dir: str | Path = "samples/sweep", results_dir: str | Path = "results/sweep",
              reuse_dir: str | Path | None = None) -> list[dict]:
    """The refresh sweep: `row` at budget T (None: the first of sample.budgets) with the anchor
    refreshed every K of `K_values` (None: sample.sweep_refresh) and with the adaptive policy at
    each threshold, each sampled and scored like a Table 2 row into
    `<results_dir>/<K<k>|adaptive<a>>.json` (samples under `<samples_dir>/<same name>/`). A
    point that is Table 2's own draw (T's scheduled K) is taken from `reuse_dir` (Table 2's
    samples directory) when given and identical (`run_row`). One torchrun launch for the whole
    sweep when runtime.nproc > 1."""
    T = int(T or params.sample.steps[0])
    K_values = [int(k) for k in (K_values or params.sample.sweep_refresh)]
    adaptive_thresholds = [float(a) for a in adaptive_thresholds]
    if worker.needs_launch(params, "sweep"):
        kwargs = dict(T=T, K_values=K_values, adaptive_thresholds=adaptive_thresholds, models_dir=str(models_dir),
                      samples_dir=str(samples_dir), results_dir=str(results_dir),
                      reuse_dir=None if reuse_dir is None else str(reuse_dir))
        return worker.launch("sweep", params, {"row": row, **scorer.worker_args(), "kwargs": kwargs})
    settings = [("K", k) for k in K_values] + [("adaptive", a) for a in adaptive_thresholds]
    results = []
    for kind, value in settings:
        name = f"{kind}{value}"
        results.append(run_row(row, params, scorer, models_dir=models_dir, steps=[T],
                               samples_dir=Path(samples_dir) / name, out=Path(results_dir) / f"{name}.json",
                               reuse_dir=reuse_dir, **({"K": value} if kind == "K" else {"adaptive": value})))
    return results


__all__ = ["ROWS", "Row", "Scorer", "run_row", "run_sweep", "validation_tokens", "save_gen_ppl", "save_features",
           "load_paired"]
