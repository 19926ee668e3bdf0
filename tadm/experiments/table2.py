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

Scoring (`Scorer`): MAUVE against `eval.reference_samples` held-out validation sequences (the
first ones; the Data row takes the next `sample.num_samples`), Gen PPL with the evaluator
(`tadm.metrics.gen_ppl`), mean per-sample token entropy of the model's own token ids, and from
the sampling record: Transformer-layer calls per generated sequence batch (the compute column)
and tokens/s over every generated position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tadm.config import Params
from tadm.data.packing import PackedTokens
from tadm.experiments.sampling import SampleRun, load_samples, run_samples
from tadm.io import atomic_write_json


@dataclass(frozen=True)
class Row:
    label: str
    model: str | None  # the training run under models/; None: the Data row
    sampler: str | None = None  # None: the profile's sample.sampler


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
}


def validation_tokens(packed_dir: str | Path, start: int, count: int) -> np.ndarray:
    """`count` held-out sequences (count, L) from validation sequence `start` on."""
    val = PackedTokens(Path(packed_dir) / "validation")
    if start + count > len(val):
        from tadm.errors import DataError

        raise DataError(f"{packed_dir}/validation has {len(val)} sequences, need {start + count} "
                        "(eval.reference_samples + sample.num_samples)")
    return np.stack([val[i] for i in range(start, start + count)])


class Scorer:
    """The evaluator, the featurizer and the reference features, loaded once."""

    def __init__(self, params: Params, tokenizer, packed_dir: str | Path, device: str = "cpu"):
        from tadm.metrics import load_evaluator, load_featurizer

        e = params.eval
        self.params, self.tokenizer, self.packed_dir = params, tokenizer, Path(packed_dir)
        self.evaluator = load_evaluator(e.evaluator, cache_dir=e.cache_dir, device=device)
        # SmolLM2 as both evaluator and featurizer: one forward pass gives both (gen_ppl_and_features)
        self.joint = e.featurizer == e.evaluator == "smollm2"
        self.featurizer = None if self.joint else load_featurizer(e.featurizer, device=device,
                                                                     batch_size=e.batch_size, cache_dir=e.cache_dir)
        self.reference = validation_tokens(packed_dir, 0, e.reference_samples)
        reference = self.texts(self.reference)  # only their features are needed
        self.reference_features = (self._ppl_and_features(reference)[1] if self.joint
                                   else self.featurizer.encode(reference))

    def _ppl_and_features(self, texts: list[str]):
        from tadm.metrics import gen_ppl
        from tadm.metrics.gen_ppl import gen_ppl_and_features

        batch = self.params.eval.batch_size
        if self.joint:
            return gen_ppl_and_features(texts, self.evaluator, batch_size=batch)
        return gen_ppl(texts, self.evaluator, batch_size=batch), self.featurizer.encode(texts)

    def texts(self, tokens: np.ndarray) -> list[str]:
        from tadm.metrics import decode_samples

        return decode_samples(tokens, self.tokenizer)

    def data_tokens(self) -> np.ndarray:
        return validation_tokens(self.packed_dir, self.params.eval.reference_samples, self.params.sample.num_samples)

    def score(self, tokens: np.ndarray) -> dict[str, float]:
        """MAUVE vs the reference, Gen PPL and mean entropy of generated token ids (N, L)."""
        from tadm.metrics import mauve_score_features, mean_entropy

        texts = self.texts(tokens)
        ppl, features = self._ppl_and_features(texts)
        mauve = mauve_score_features(features, self.reference_features)
        return {"mauve": float(mauve), "gen_ppl": float(ppl.ppl), "entropy": float(mean_entropy(tokens))}


def save_data_samples(tokens: np.ndarray, out_dir: Path, steps: int, start: int) -> dict[str, Any]:
    """The Data row's "samples" (held-out validation sequences) saved like a model's, so every
    row of the table has its texts on disk."""
    from tadm.io import atomic_path

    record = {"row": "data", "T": steps, "sampler": "data", "policy": None, "counters": {}, "tokens_per_s": None,
              "source": f"data/packed/validation sequences {start}..{start + len(tokens) - 1}"}
    with atomic_path(out_dir / f"T{steps}.npy") as tmp, open(tmp, "wb") as f:
        np.save(f, tokens.astype(np.int64), allow_pickle=False)
    atomic_write_json(out_dir / f"T{steps}.json", record)
    return record


def run_row(name: str, params: Params, scorer: Scorer, *, models_dir: str | Path = "models",
            samples_dir: str | Path = "samples", steps: list[int] | None = None, K: int | None = None,
            adaptive: float | None = None, checkpoint: str | None = None, sampler: str | None = None,
            out: str | Path | None = None) -> dict[str, Any]:
    """Sample (or, for Data, read) and score one row at every budget T (or `steps`); write
    `out` (JSON). `checkpoint` / `sampler` replace the row's model directory / sampler."""
    row = ROWS[name] if name in ROWS else Row(name, name)
    bos_id = scorer.tokenizer.bos_token_id
    budgets = list(steps or params.sample.steps)
    result: dict[str, Any] = {"row": name, "label": row.label, "budgets": {}}
    for T in budgets:
        if row.model is None:
            tokens = scorer.data_tokens()
            record = save_data_samples(tokens, Path(samples_dir) / name, T, start=params.eval.reference_samples)
        else:
            spec = SampleRun(name, checkpoint or str(Path(models_dir) / row.model), sampler or row.sampler, K=K,
                             adaptive=adaptive)
            out_dir = Path(samples_dir) / name
            record = run_samples(spec, params, T, out_dir, bos_id=bos_id)
            tokens, _ = load_samples(out_dir, T)
        metrics = scorer.score(tokens)
        counters = record.get("counters", {})
        result["budgets"][str(T)] = {
            **metrics, "T": T, "sampler": record["sampler"], "policy": record.get("policy"),
            "layer_calls": counters.get("layer_calls_per_trajectory"),
            "anchor_calls": counters.get("anchor_calls"),
            "flops_per_token": counters.get("flops_per_token"),
            "tokens_per_s": record.get("tokens_per_s"),
            "refreshes_per_trajectory": record.get("refreshes_per_trajectory"),
            "examples": scorer.texts(tokens[:2]),
        }
    if out is not None:
        atomic_write_json(out, result)
    return result


__all__ = ["ROWS", "Row", "Scorer", "run_row", "validation_tokens"]
