"""The training replicates' draws: Table 2's compared rows sampled from every replicate.

Table 2 shows one training run per model (seed ``seed``). The models a finding compares also
train with seeds seed + 1, ... (``train.replicate_models``, ``train.replicates``; stage train,
``models/replicates/<run>-s<seed>``). The `replicates` stage (``python -m tadm replicates``)
samples each row of ``sample.replicate_rows`` from every training replicate of its model at
every budget of ``sample.replicate_steps`` (the findings' budgets), exactly as the row's own stage
does (`tadm.experiments.table2.run_row`: its sampler, K, fusion setting and scorer), with the
replicate's seed as the sampling seed too (each replicate an independent draw of training and
sampling), and writes

    samples/replicates/s<seed>/<row>/T<T>_*.npy    the per-sample scores (MAUVE features, Gen PPL terms)
    results/replicates/<row>-s<seed>.json           the row's result, as results/table2/<row>.json, + "seed", "model_dir"

The claims stage (`tadm.experiments.claims`) pools the between-run variance over these and the
seed-``seed`` rows (`tadm.metrics.replicates`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tadm.config import Params, override
from tadm.errors import ConfigError
from tadm.io import atomic_write_json
from tadm.experiments.table2 import ROWS, Scorer, run_row
from tadm.train.trainer import REPLICATES, replicate_name, replicate_seeds

SAMPLES = Path("samples") / REPLICATES
RESULTS = Path("results") / REPLICATES


def check(p: Params) -> None:
    """Every replicated row's model has training replicates (a ConfigError naming the key)."""
    for row in p.sample.replicate_rows:
        if ROWS[row].model not in p.train.replicate_models:
            raise ConfigError("sample.replicate_rows", f"row {row!r} samples model {ROWS[row].model!r}, which "
                              f"train.replicate_models ({p.train.replicate_models}) does not replicate")


def draws(p: Params) -> list[tuple[str, int]]:
    """(row, seed) of every replicate draw, in the stage's order."""
    return [(row, seed) for row in p.sample.replicate_rows for seed in replicate_seeds(p)]


def samples_dir(root: Path, row: str, seed: int) -> Path:
    """Where a replicate draw's per-sample scores lie (the layout `table2.load_paired` reads)."""
    return root / SAMPLES / f"s{seed}" / row


def model_dir(p: Params, row: str, seed: int, root: Path = Path(".")) -> Path:
    """The training replicate of `row`'s model at `seed` (models/replicates/<run>-s<seed>)."""
    return root / "models" / REPLICATES / replicate_name(ROWS[row].model, seed)


def require_models(p: Params, root: Path = Path(".")) -> None:
    """Every replicate the draws need is trained (else a ConfigError naming the command)."""
    check(p)
    for row, seed in draws(p):
        model = model_dir(p, row, seed, root)
        if not (model / "config.json").is_file():
            raise ConfigError("train.replicates", f"{model}: no trained replicate here; run `dvc repro train` "
                              f"(or `python -m tadm train {ROWS[row].model} --replicate {seed - p.seed}`)")


def run(p: Params, scorer: Scorer, root: Path = Path("."), log=print) -> list[dict[str, Any]]:
    """Sample and score every replicate draw (see the module docstring); return their results."""
    require_models(p, root)
    for d in (root / SAMPLES, root / RESULTS):  # the stage's outputs, empty when nothing is replicated
        d.mkdir(parents=True, exist_ok=True)
    out = []
    for row, seed in draws(p):
        model = model_dir(p, row, seed, root)
        q = override(p, {"seed": seed})
        r = run_row(row, q, scorer, checkpoint=str(model), steps=list(p.sample.replicate_steps),
                    samples_dir=str(root / SAMPLES / f"s{seed}"))
        r = {**r, "seed": seed, "model_dir": str(model.relative_to(root))}
        if scorer.dist.main:
            atomic_write_json(root / RESULTS / f"{row}-s{seed}.json", r)
        out.append(r)
        log(f"replicates[{row}-s{seed}]: " + ", ".join(f"T = {T}: MAUVE {b['mauve']:.3f}, Gen PPL {b['gen_ppl']:.1f}"
                                                      for T, b in r["budgets"].items()))
    return out


__all__ = ["SAMPLES", "RESULTS", "check", "draws", "samples_dir", "model_dir", "require_models", "run"]
