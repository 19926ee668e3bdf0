"""The scorer of Table 2's samples: the evaluator, the featurizer and the reference features.

Moved here from ``tadm.experiments.table2`` (which re-exports it) so that the trained judge
(`tadm.metrics.trained_evaluator`) scores with it without importing the experiments: MAUVE
against `eval.reference_samples` held-out validation sequences, Gen PPL with the evaluator
(`tadm.metrics.gen_ppl`), the mean per-sample token entropy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tadm import runtime
from tadm.config import Params
from tadm.data.packing import PackedTokens
from tadm.errors import DataError
from tadm.io import atomic_path, atomic_write_json
from tadm.metrics import bootstrap, decode_samples, gen_ppl, load_evaluator, load_featurizer, mauve_score_features
from tadm.metrics.entropy import sample_entropy
from tadm.metrics.features import MAUVE_MAX_TOKENS, SMOLLM2, weights_fingerprint
from tadm.metrics.gen_ppl import gen_ppl_and_features

REFERENCE_CACHE_FORMAT = 1
TRAINED = "trained"  # eval.evaluator / eval.featurizer: the judge the pipeline trains
MODEL_DIR = Path("models/evaluator")  # where it is saved (tadm.metrics.trained_evaluator)


def resolve(name: str) -> str:
    """An eval.evaluator / eval.featurizer value with "trained" mapped to the model directory."""
    if name == TRAINED:
        if not (MODEL_DIR / "config.json").is_file():
            raise DataError(f"eval evaluator 'trained': {MODEL_DIR} has no model; run the evaluator stage first "
                            "(dvc repro train, or alone: python -m tadm evaluator)")
        return str(MODEL_DIR)
    return name


def validation_tokens(packed_dir: str | Path, start: int, count: int) -> np.ndarray:
    """`count` held-out sequences (count, L) from validation sequence `start` on."""
    val = PackedTokens(Path(packed_dir) / "validation")
    if start + count > len(val):
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

        # the featurizer's convention: MAUVE's own (the last token's final state) for GPT-2 Large,
        # the trained judge and other models; the mean of the final states for SmolLM2. The trained
        # judge's mean-pooled features barely tell text from text shuffled within its lines (MAUVE
        # 0.44 against the check's <= 0.1), its last-token features do (0.013; data vs data 0.946
        # and 0.947): measured on the committed default judge, metrics/evaluator.json's checks
        self.pooling = "mean" if e.featurizer == SMOLLM2 else "last"
        self._evaluator = self._featurizer = self._reference = self._reference_features = None
        self.reference_source: str | None = None  # "computed" or "cache", once the reference features are read

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
            e = self.params.eval
            self._evaluator = load_evaluator(resolve(e.evaluator), cache_dir=e.cache_dir, device=self.dist.device,
                                             dtype=self.dtype)
        return self._evaluator

    @property
    def featurizer(self):
        """The MAUVE featurizer when it is not the evaluator (None when it is)."""
        if self._featurizer is None and not self.joint:
            e = self.params.eval
            self._featurizer = load_featurizer(resolve(e.featurizer), device=self.dist.device, dtype=self.dtype,
                                               batch_size=e.batch_size, cache_dir=e.cache_dir)
        return self._featurizer

    def worker_args(self) -> dict[str, str]:
        """How a torchrun worker rebuilds this Scorer (`tadm.experiments.worker`)."""
        tokenizer_dir = getattr(self.tokenizer, "name_or_path", None)
        if not tokenizer_dir:
            raise DataError("Scorer: the tokenizer does not say where it was loaded from (name_or_path); "
                            "load it with tadm.data.tokenizer.load_tokenizer")
        return {"tokenizer": str(tokenizer_dir), "packed_dir": str(self.packed_dir)}

    # ------------------------------------------------------------------ features and Gen PPL

    def _ppl_and_features(self, texts: list[str]):
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
        return decode_samples(tokens, self.tokenizer)

    def data_tokens(self) -> np.ndarray:
        return validation_tokens(self.packed_dir, self.params.eval.reference_samples, self.params.sample.num_samples)

    def score_samples(self, tokens: np.ndarray):
        """(metrics, GenPPL, features) of generated token ids (N, L): MAUVE vs the reference, Gen
        PPL and mean entropy, each with its bootstrap uncertainty ``<metric>_se`` over
        eval.bootstrap resamples (`tadm.metrics.bootstrap`; absent when 0), the per-sample Gen PPL
        values, and the samples' MAUVE features (N, D) (saved beside them for paired bootstraps).
        MAUVE's clustering runs on every process on the same gathered features (deterministic,
        one thread), so every process returns it."""
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
        return metrics, ppl, features

    def score(self, tokens: np.ndarray) -> dict[str, float]:
        """MAUVE vs the reference, Gen PPL and mean entropy of generated token ids (N, L)."""
        return self.score_samples(tokens)[0]
