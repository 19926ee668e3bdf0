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
    tadm_gamma0   TADM-dagger (gamma = 0), ReMDM-loop, anchor refreshed every K (sample.refresh_every)
    tadm          TADM-double-dagger (gamma = train.gamma), the same
    tadm_nofusion TADM-double-dagger's model with the fusion bypassed (issue 31): the same anchor
                  cache and K, but the denoiser reads the cached anchor as is, D(h), never the
                  current canvas between refreshes (`TADMAdapter(bypass_fusion=True)`)

Scoring (`Scorer`): MAUVE against `eval.reference_samples` held-out validation sequences (the
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
`python -m torch.distributed.run ... -m tadm.experiments.worker` (`tadm.experiments.worker`):
sampling batches and scoring batches are split over the processes, which give the same samples
and scores as one process (`tadm.experiments.sampling`, `tadm.metrics.shards`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tadm import runtime
from tadm.config import Params
from tadm.data.packing import PackedTokens
from tadm.experiments import worker
from tadm.experiments.sampling import SampleRun, draw_samples, reusable_samples, save_samples, shared_record
from tadm.io import atomic_path, atomic_write_json

REFERENCE_CACHE_FORMAT = 1


@dataclass(frozen=True)
class Row:
    label: str
    model: str | None  # the training run under models/; None: the Data row
    sampler: str | None = None  # None: the profile's sample.sampler
    bypass_fusion: bool = False  # TADM: the fusion ablation (SampleRun.bypass_fusion)


ROWS: dict[str, Row] = {
    "data": Row("Data", None),
    "ar": Row("AR", "ar", "ar"),
    "sedd": Row("SEDD", "sedd", "sedd-analytic"),
    "mdlm": Row("MDLM", "mdlm", "mdlm"),
    "mdlm_fb": Row("MDLM+FB", "mdlm", "mdlm-fb"),
    "mdlm_dfm": Row("MDLM+DFM", "mdlm", "mdlm-dfm"),
    "remdm": Row("ReMDM", "mdlm", "remdm-loop"),
    "adlm": Row("ADLM", "adlm", "remdm-loop"),
    "tadm_gamma0": Row("TADM† (γ=0)", "tadm_gamma0", "remdm-loop"),
    "tadm": Row("TADM‡ (γ=3e-3)", "tadm", "remdm-loop"),
    "tadm_nofusion": Row("TADM‡, fusion bypassed", "tadm", "remdm-loop", bypass_fusion=True),
}


def validation_tokens(packed_dir: str | Path, start: int, count: int) -> np.ndarray:
    """`count` held-out sequences (count, L) from validation sequence `start` on."""
    val = PackedTokens(Path(packed_dir) / "validation")
    if start + count > len(val):
        from tadm.errors import DataError

        raise DataError(f"{packed_dir}/validation has {len(val)} sequences, need {start + count} "
                        "(eval.reference_samples + sample.num_samples)")
    return np.stack([val[i] for i in range(start, start + count)])


def _sha256_texts(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


class Scorer:
    """The evaluator, the featurizer (when it is another model) and the reference features.

    Everything loads on first use, on the device of `dist` (None: `runtime.setup(params.runtime)`),
    so a Scorer whose rows run in torchrun workers (runtime.nproc > 1) never loads a model in the
    calling process."""

    def __init__(self, params: Params, tokenizer, packed_dir: str | Path, dist: runtime.Dist | None = None):
        e = params.eval
        self.params, self.tokenizer, self.packed_dir = params, tokenizer, Path(packed_dir)
        self._dist = dist
        # the evaluator is also the featurizer: one forward pass gives both (gen_ppl_and_features)
        self.joint = e.featurizer == e.evaluator
        from tadm.metrics.features import SMOLLM2

        # the featurizer's convention: MAUVE's own (the last token's final state) for GPT-2 Large,
        # the trained judge and other models; the mean of the final states for SmolLM2. The trained
        # judge's mean-pooled features barely tell text from text shuffled within its lines (MAUVE
        # 0.44 against the check's <= 0.1), its last-token features do (0.013; data vs data 0.946
        # and 0.947): measured on the committed default judge, metrics/evaluator.json's checks
        self.pooling = "mean" if e.featurizer == SMOLLM2 else "last"
        self._evaluator = self._featurizer = self._reference = self._reference_features = None
        self.reference_source: str | None = None  # "computed" or "cache", once the reference features are read
        self.last_features: np.ndarray | None = None

    # ------------------------------------------------------------------ where and in what precision

    @property
    def dist(self) -> runtime.Dist:
        if self._dist is None:
            self._dist = runtime.setup(self.params.runtime)
        return self._dist

    def autocast(self):
        """The scorers' autocast: bf16 on a GPU with runtime.precision bf16, none on any CPU, even
        one with native bf16 that the samplers use (`runtime.effective_precision`, cpu_bf16)."""
        return self.dist.autocast(cpu_bf16=False)

    @property
    def precision(self) -> str:
        """What :meth:`autocast` runs in: "bf16" or "fp32" (kept in the reference-feature key)."""
        return self.dist.effective_precision(cpu_bf16=False)

    @property
    def dtype(self) -> torch.dtype:
        """The scorers' weights: bf16 where :meth:`autocast` runs in bf16 (a GPU), fp32 otherwise."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    @property
    def evaluator(self):
        if self._evaluator is None:
            from tadm.metrics import load_evaluator
            from tadm.metrics.trained_evaluator import resolve

            e = self.params.eval
            self._evaluator = load_evaluator(resolve(e.evaluator), cache_dir=e.cache_dir, device=self.dist.device,
                                             dtype=self.dtype)
        return self._evaluator

    @property
    def featurizer(self):
        """The MAUVE featurizer when it is not the evaluator (None when it is)."""
        if self._featurizer is None and not self.joint:
            from tadm.metrics import load_featurizer
            from tadm.metrics.trained_evaluator import resolve

            e = self.params.eval
            self._featurizer = load_featurizer(resolve(e.featurizer), device=self.dist.device, dtype=self.dtype,
                                               batch_size=e.batch_size, cache_dir=e.cache_dir)
        return self._featurizer

    def worker_args(self) -> dict[str, str]:
        """How a torchrun worker rebuilds this Scorer (`tadm.experiments.worker`)."""
        tokenizer_dir = getattr(self.tokenizer, "name_or_path", None)
        if not tokenizer_dir:
            from tadm.errors import DataError

            raise DataError("Scorer: the tokenizer does not say where it was loaded from (name_or_path); "
                            "load it with tadm.data.tokenizer.load_tokenizer")
        return {"tokenizer": str(tokenizer_dir), "packed_dir": str(self.packed_dir)}

    # ------------------------------------------------------------------ features and Gen PPL

    def _ppl_and_features(self, texts: list[str]):
        from tadm.metrics import gen_ppl
        from tadm.metrics.features import MAUVE_MAX_TOKENS
        from tadm.metrics.gen_ppl import gen_ppl_and_features

        batch, d = self.params.eval.batch_size, self.dist
        length = self.params.sample.canvas_length  # MDLM retokenizes with max_length = model.length
        with self.autocast():
            if self.joint:
                return gen_ppl_and_features(texts, self.evaluator, batch_size=batch, max_feature_tokens=MAUVE_MAX_TOKENS,
                                            pooling=self.pooling, dist=d, max_length=length)
            return (gen_ppl(texts, self.evaluator, batch_size=batch, max_length=length, dist=d),
                    self.featurizer.encode(texts, dist=d))

    def _features(self, texts: list[str]) -> np.ndarray:
        if self.joint:
            return self._ppl_and_features(texts)[1]
        with self.autocast():
            return self.featurizer.encode(texts, dist=self.dist)

    @property
    def reference(self) -> np.ndarray:
        if self._reference is None:
            self._reference = validation_tokens(self.packed_dir, 0, self.params.eval.reference_samples)
        return self._reference

    def reference_key(self, texts: list[str]) -> dict[str, Any]:
        """What the reference features depend on: the featurizer (its name, convention and a
        fingerprint of its weights), the precision and device type they are computed in, the
        batch size (padding changes the last bits), and the reference texts themselves (the
        reference token ids decoded with the project tokenizer)."""
        from tadm.metrics.features import MAUVE_MAX_TOKENS, weights_fingerprint

        e = self.params.eval
        model = self.evaluator.model if self.joint else self.featurizer.model
        return {"format": REFERENCE_CACHE_FORMAT, "featurizer": e.featurizer,
                "featurizer_kind": f"{self.pooling} (one pass with the evaluator)" if self.joint
                else type(self.featurizer).__name__,
                "max_tokens": MAUVE_MAX_TOKENS if self.joint else self.featurizer.max_length,
                "weights": weights_fingerprint(model), "dtype": str(self.dtype).removeprefix("torch."),
                "autocast": self.precision,
                "device_type": self.dist.device.type, "batch_size": e.batch_size, "texts": _sha256_texts(texts),
                "count": len(texts)}

    def reference_cache_path(self, texts: list[str], key: dict[str, Any] | None = None) -> Path:
        """<eval.cache_dir>/reference_features-<hash of reference_key>.npy (a .json beside it
        holds the key)."""
        text = json.dumps(key or self.reference_key(texts), sort_keys=True)
        return Path(self.params.eval.cache_dir) / f"reference_features-{hashlib.sha256(text.encode()).hexdigest()[:24]}.npy"

    @property
    def reference_features(self) -> np.ndarray:
        """(reference_samples, dim) float32: read from the cache when it holds them, else computed
        (split over the processes) and cached by the main process."""
        if self._reference_features is None:
            texts = self.texts(self.reference)
            key = self.reference_key(texts)
            path = self.reference_cache_path(texts, key)
            features = None
            if path.is_file():
                try:
                    features = np.load(path, allow_pickle=False)
                except (OSError, ValueError):
                    features = None
                if features is not None and (features.ndim != 2 or features.shape[0] != len(texts)
                                             or not np.isfinite(features).all()):
                    features = None
            d = self.dist
            if d.world > 1 and not all(runtime.gather([features is not None], d.world, d)):
                features = None  # every process computes (their batches are shared) or none does
            if features is not None:
                self.reference_source = "cache"
            else:
                features = self._features(texts)
                self.reference_source = "computed"
                if d.main:
                    with atomic_path(path) as tmp, open(tmp, "wb") as f:
                        np.save(f, features.astype(np.float32), allow_pickle=False)
                    atomic_write_json(path.with_suffix(".json"), key)
            self._reference_features = features
        return self._reference_features

    # ------------------------------------------------------------------ scoring

    def texts(self, tokens: np.ndarray) -> list[str]:
        from tadm.metrics import decode_samples

        return decode_samples(tokens, self.tokenizer)

    def data_tokens(self) -> np.ndarray:
        return validation_tokens(self.packed_dir, self.params.eval.reference_samples, self.params.sample.num_samples)

    def score_samples(self, tokens: np.ndarray):
        """(metrics, GenPPL) of generated token ids (N, L): MAUVE vs the reference, Gen PPL and
        mean entropy, each with its bootstrap uncertainty ``<metric>_se`` over eval.bootstrap
        resamples (`tadm.metrics.bootstrap`; absent when 0), and the per-sample Gen PPL values.
        MAUVE's clustering runs on every process on the same gathered features (deterministic,
        one thread), so every process returns it."""
        from tadm.metrics import bootstrap, mauve_score_features
        from tadm.metrics.entropy import sample_entropy

        reference = self.reference_features
        ppl, features = self._ppl_and_features(self.texts(tokens))
        entropy = sample_entropy(tokens)
        # MAUVE as released (ReMDM's eval: p = human text, q = samples)
        metrics = {"mauve": float(mauve_score_features(reference, features)), "gen_ppl": float(ppl.ppl),
                   "entropy": float(entropy.mean()), "num_samples": len(tokens), "num_references": len(reference)}
        B = self.params.eval.bootstrap
        if B:
            metrics |= {"mauve_se": bootstrap.mauve_se(reference, features, B),
                        "gen_ppl_se": bootstrap.gen_ppl_se(ppl.nll, ppl.tokens, B),
                        "entropy_se": bootstrap.mean_se(entropy, B), "bootstrap": B}
        self.last_features = features  # the samples' MAUVE features (run_row saves them for paired bootstraps)
        return metrics, ppl

    def score(self, tokens: np.ndarray) -> dict[str, float]:
        """MAUVE vs the reference, Gen PPL and mean entropy of generated token ids (N, L)."""
        return self.score_samples(tokens)[0]


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
    kwargs = dict(models_dir=str(models_dir), samples_dir=str(samples_dir), steps=steps, K=K, adaptive=adaptive,
                  checkpoint=checkpoint, sampler=sampler, out=None if out is None else str(out),
                  reuse_dir=None if reuse_dir is None else str(reuse_dir))
    if worker.needs_launch(params):
        return worker.launch("row", params, {"name": name, **scorer.worker_args(), "kwargs": kwargs})
    d = scorer.dist
    row = ROWS[name] if name in ROWS else Row(name, name)
    bos_id = scorer.tokenizer.bos_token_id
    budgets = list(steps or params.sample.steps)
    out_dir = Path(samples_dir) / name
    result: dict[str, Any] = {"row": name, "label": row.label, "budgets": {}}
    shared = None  # (tokens, record, metrics, ppl) of a row whose samples do not depend on T
    for T in budgets:
        if row.model is None:
            if shared is None:
                tokens = scorer.data_tokens()
                shared = (tokens, None, *scorer.score_samples(tokens))
            tokens, _, metrics, ppl = shared
            record = data_record(T, params.eval.reference_samples, len(tokens))
            if d.main:
                save_data_samples(tokens, out_dir, T, start=params.eval.reference_samples)
        elif shared is not None:  # AR: the samples of the first budget serve this one too
            tokens, first, metrics, ppl = shared
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
            metrics, ppl = scorer.score_samples(tokens)
            if record["model_type"] == "ar":
                shared = (tokens, record, metrics, ppl)
        if d.main:
            save_gen_ppl(ppl, out_dir, T)
            save_features(scorer.last_features, scorer.reference_features, out_dir, T)
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
    """The refresh sweep: `row` at budget T (None: the first of sample.steps) with the anchor
    refreshed every K of `K_values` (None: sample.sweep_refresh) and with the adaptive policy at
    each threshold, each sampled and scored like a Table 2 row into
    `<results_dir>/<K<k>|adaptive<a>>.json` (samples under `<samples_dir>/<same name>/`). A
    point that is Table 2's own draw (T's scheduled K) is taken from `reuse_dir` (Table 2's
    samples directory) when given and identical (`run_row`). One torchrun launch for the whole
    sweep when runtime.nproc > 1."""
    T = int(T or params.sample.steps[0])
    K_values = [int(k) for k in (K_values or params.sample.sweep_refresh)]
    adaptive_thresholds = [float(a) for a in adaptive_thresholds]
    if worker.needs_launch(params):
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
