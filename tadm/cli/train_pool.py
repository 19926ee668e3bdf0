"""The train stage's job pool (`python -m tadm train` with several runs or none): every network the
pipeline trains as one job each, their cost proxy (the pool starts the longest first) and the
jobs that wait for others (the fusions on the post-train base)."""

from __future__ import annotations

import sys
from pathlib import Path

from tadm import config
from tadm.errors import ConfigError, TadmError

JOBS_RECORD = Path("metrics/train/jobs.json")


# jobs of the train stage that start only once others have finished: TADM:Post-train's fusion and
# its fresh-anchor control train on the frozen post-train base, and so do their replicates
# (posttrain.replicates; names dg_posttrain-s<seed>, dg_posttrain_fresh-s<seed>: posttrain_after)
TRAIN_AFTER = {"dg_posttrain": ("dg_base",), "dg_posttrain_fresh": ("dg_base",)}


def posttrain_after(p: config.Params) -> dict[str, tuple[str, ...]]:
    """TRAIN_AFTER with the fusion replicates of `p` (each after dg_base, like its main run)."""
    from tadm.posttrain.train import fusion_runs  # lazy: CLI start-up loads a command's modules only when it runs

    return {**TRAIN_AFTER, **{r.name: ("dg_base",) for fresh in (False, True) for r in fusion_runs(p, fresh)[1:]}}


def train_jobs(p: config.Params, args) -> list[tuple[str, list[str], float]]:
    """(name, command, cost) of each job of `python -m tadm train [runs...]`: the runs asked for, or
    with none every network the pipeline trains (train.models and the training replicates of
    train.replicate_models, the evaluator, the post-train base,
    TADM:Post-train's fusion and its fresh-anchor control (after the base, TRAIN_AFTER), the ASRD
    model, then the fusion's and the control's replicates of posttrain.replicates, also after the
    base: :func:`posttrain_after`). The cost is a proxy of the training FLOPs (tokens seen x layer passes x width^2) that
    orders the jobs longest first."""
    from tadm.memory_estimate import layers  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.train.trainer import replicate_name, replicate_seeds  # lazy: CLI start-up loads a command's modules only when it runs

    unknown = [r for r in args.runs if r not in p.train.models]
    if unknown:
        raise ConfigError("train.models", f"has no run {', '.join(map(repr, unknown))} (it lists {p.train.models})")
    twice = sorted({r for r in args.runs if args.runs.count(r) > 1})
    if twice:
        raise TadmError(f"python -m tadm train: run {', '.join(map(repr, twice))} named more than once "
                        "(two jobs would train one checkpoint directory)")
    tadm = [sys.executable, "-m", "tadm", "--params", str(args.params)]
    restart = ["--restart"] if args.restart else []
    m, t = p.model, p.train

    def cost(layer_passes: int, width: int, tokens: int) -> int:
        """The proxy, in layers x width^2 per token: a forward pass counts 1, a backward pass 2,
        times the tokens seen (the vocabulary heads left out)."""
        return layer_passes * width ** 2 * tokens

    jobs = [(r, [*tadm, "train", r, "--data", args.data, *restart],
             cost(3 * layers(r, m), m.d_model, t.steps * t.global_batch * p.packing.seq_len))
            for r in (args.runs or p.train.models)]
    if args.runs:
        return jobs
    # the training replicates of train.replicate_models: the same recipe, seeds seed + 1, ...
    jobs += [(replicate_name(r, seed), [*tadm, "train", r, "--replicate", str(seed - p.seed), "--data", args.data,
                                        *restart],
              cost(3 * layers(r, m), m.d_model, t.steps * t.global_batch * p.packing.seq_len))
             for r in t.replicate_models for seed in replicate_seeds(p)]
    e, b, pt, a = p.eval.trained, p.posttrain.base, p.posttrain, p.asrd
    from tadm.posttrain.train import fusion_runs  # lazy: CLI start-up loads a command's modules only when it runs

    # replicate k of the fusion, then of the control, k = 1, 2, ...: two side by side train one of each
    fusion_replicates = [run for pair in zip(fusion_runs(p, False)[1:], fusion_runs(p, True)[1:]) for run in pair]
    depth = pt.shared_layers + pt.anchor_layers + pt.denoiser_layers
    dg_tokens = pt.max_context_tokens + pt.canvas_length  # DiffusionGemma over context + canvas
    return jobs + [
        ("evaluator", [*tadm, "evaluator", *restart],
         cost(3 * e.n_layers, e.d_model, e.steps * e.batch_size * p.packing.seq_len)),
        # a self-conditioning forward pass, then the trained pass
        ("dg_base", [*tadm, "dg-base", *restart],
         cost((1 + 3) * depth, b.hidden_size, b.steps * b.batch_size * dg_tokens)),
        ("asrd_model", [*tadm, "asrd-model", *restart],
         cost(3 * m.mdlm_layers, m.d_model, a.train_steps * a.train_batch * (a.prompt_tokens + a.response_tokens))),
        # a rollout of the frozen base, then its forward pass with the fusion, the backward pass
        # only through the fusion and the denoiser layers after it (measured: 0.62 of the base's
        # per-token seconds, this proxy 0.63)
        *((name, [*tadm, "dg-posttrain", *fresh, *restart],
           cost(2 * depth + 2 * pt.denoiser_layers, b.hidden_size, pt.steps * pt.batch_size * dg_tokens))
          for name, fresh in (("dg_posttrain", []), ("dg_posttrain_fresh", ["--fresh-anchor"]))),
        # their fusion replicates (posttrain.replicates): the same recipe, seeds posttrain.seed + 1, ...
        *((run.name, [*tadm, "dg-posttrain", "--replicate", str(run.replicate), *(["--fresh-anchor"] if run.fresh else []),
                      *restart],
           cost(2 * depth + 2 * pt.denoiser_layers, b.hidden_size, pt.steps * pt.batch_size * dg_tokens))
          for run in fusion_replicates),
    ]
