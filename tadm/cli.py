"""Command line: ``python -m tadm <command>`` (also installed as ``tadm``).

DVC stages call these commands; each reads ``params.yaml``, does one stage's work and
writes its outputs atomically. Errors caused by input print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tadm import config
from tadm.errors import TadmError

# Stage outputs, relative to the repository root (the working directory of `dvc repro`).
CORPUS_DIR = Path("data/corpus")
TOKENIZER_DIR = Path("data/tokenizer")
PACKED_DIR = Path("data/packed")
SFT_DIR = Path("data/sft")


class _Parser(argparse.ArgumentParser):
    """The command line's parser: no prefix matching (``--ref`` is not ``--refresh-every``) and
    every error one line, exit 2 (argparse prints the usage first otherwise)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _key(key: str, *, entry: bool = False):
    """An argparse `type` that reads a flag as the params key `key` reads a value (`entry`: one
    entry of that list key): its type -- an integer is never truncated from a float -- and its
    ranges and registry, from the declaration params.yaml is checked against."""
    from tadm.config import notebook as nb

    def parse(text: str):
        tp = nb.field_type(key, entry=entry)
        value: object = text
        if tp is int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer (as {key}), got {text!r}") from None
        elif tp is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number (as {key}), got {text!r}") from None
        try:
            return nb.parameter(key, value, key, entry=entry)
        except TadmError as e:
            raise argparse.ArgumentTypeError(getattr(e, "detail", str(e)) + f" (as {key})") from None

    parse.__name__ = key  # argparse names the type in "invalid <type> value" messages
    return parse


def _block_index(text: str) -> int:
    """--block, --replicate: an index, a whole number in [0, 65535] (argparse's one-line error
    otherwise; whether that block or replicate exists is checked where it is used)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535] (an index of a block or a replicate), got {value}")
    return value


def _params(args) -> config.Params:
    return config.load(args.params)


def cmd_profile(args) -> None:
    """Show the active profile, or switch params.yaml to another: refused (one line) where HEAD
    commits the results of another profile, unless --force; --restore brings the committed run
    back (tadm.config._switch)."""
    from tadm.config import _switch
    from tadm.errors import ConfigError

    if args.restore:
        if args.name is not None:
            config.render_profile(args.name)  # an unknown name: its own line first
        for line in _switch.restore(args.name, Path(args.params)):
            print(line)
        return
    if args.name is None:
        if args.force:
            raise ConfigError("--force", "needs a profile name: python -m tadm profile NAME --force", source=_switch.SOURCE)
        current = config.load(args.params).profile if Path(args.params).exists() else "(none)"
        print(f"active profile: {current}; available: {', '.join(config.available_profiles())}")
        return
    config.render_profile(args.name)  # an unknown or broken profile: its own line, before git is asked
    note = _switch.check_switch(args.name, Path(args.params), force=args.force)
    path = config.write_profile(args.name, args.params)
    print(f"wrote {path} from profiles/{args.name}.yaml")
    if note:
        print(note)


def cmd_check(args) -> None:
    """Validate the params file (every key set, each in range), then estimate the memory of
    training each model of train.models and of the post-training base, and refuse (one line,
    exit 2) a setting that cannot fit the machine (tadm.memory_estimate has the formulas)."""
    from tadm import memory_estimate as me
    from tadm.experiments import replicates

    p = _params(args)
    replicates.check(p)
    available, where, on_gpu = me.machine_memory(p)
    result = me.check_memory(p, source=Path(args.params).name, available=available, where=where, on_gpu=on_gpu)
    print(f"{args.params}: valid (profile {p.profile!r})")
    biggest = max(result, key=lambda e: e.total)
    print(f"memory: the largest need is about {biggest.total / me.GIB:.2f} GiB ({biggest.name}) of "
          f"{available / me.GIB:.1f} GiB {where}")
    fits = {kind: me.largest_micro_batch(kind, p, available, on_gpu) for kind in dict.fromkeys(p.train.models)}
    print(f"micro-batch: train.micro_batch is {p.train.micro_batch}; the largest that fits this machine: "
          + ", ".join(f"{m} ({kind})" for kind, m in fits.items()))


def cmd_corpus(args) -> None:
    from tadm.data import corpus

    m = corpus.build(_params(args).corpus, args.out or CORPUS_DIR)
    print(json.dumps(m["counts"]))


def cmd_tokenizer(args) -> None:
    from tadm.data import tokenizer

    m = tokenizer.build(_params(args).tokenizer, args.corpus, args.out or TOKENIZER_DIR)
    print(json.dumps(m["counts"]))


def cmd_pack(args) -> None:
    from tadm.data import packing
    from tadm.data.tokenizer import load_tokenizer

    m = packing.build(_params(args).packing, args.corpus, load_tokenizer(args.tokenizer), args.out or PACKED_DIR)
    print(json.dumps(m["counts"]))


def cmd_sft(args) -> None:
    from tadm.data import sft
    from tadm.data.tokenizer import load_tokenizer

    p = _params(args)
    tok_name = args.tokenizer if p.sft.tokenizer == "project" else p.sft.tokenizer
    m = sft.build(p, load_tokenizer(tok_name), Path(args.out or SFT_DIR))
    print(json.dumps(m["counts"]))


def _relaunched(p: config.Params, args, *command: str) -> bool:
    """runtime.nproc > 1 and not yet under torchrun: run this command again as nproc processes
    (``torchrun --nproc_per_node=N -m tadm ...``), wait for them and report True. Under torchrun
    (or with nproc 1) False: this process is one rank and does its share."""
    from tadm import runtime

    argv = ["tadm", "--params", str(args.params), *command, *(["--restart"] if args.restart else [])]
    return runtime.relaunch(p.runtime.nproc, argv)


def _add_restart(p: argparse.ArgumentParser) -> None:
    p.add_argument("--restart", action="store_true",
                   help="start over: move the run's checkpoints aside to checkpoints/<run>.old-<step> (nothing is deleted) "
                   "instead of resuming; needed after a change of the settings the checkpoints were trained with")


def cmd_train(args) -> None:
    from tadm import runtime
    from tadm.train.trainer import train

    p = _params(args)
    if args.replicate and len(args.runs) != 1:
        raise TadmError("python -m tadm train: --replicate needs exactly one run (e.g. `train tadm --replicate 1`)")
    if args.replicate and args.runs[0] not in p.train.replicate_models:
        from tadm.errors import ConfigError

        raise ConfigError("--replicate", f"run {args.runs[0]!r} has no training replicates (train.replicate_models: "
                          f"{', '.join(p.train.replicate_models) or 'none'})", "python -m tadm train")
    if len(args.runs) == 1:
        replicate = ["--replicate", str(args.replicate)] if args.replicate else []
        if _relaunched(p, args, "train", args.runs[0], "--data", args.data, *replicate):
            return
        summary = train(args.runs[0], p, data_dir=Path(args.data), restart=args.restart, replicate=args.replicate)
        if summary:
            print(json.dumps(summary))
        return
    # several runs, or none (the train stage: every network the pipeline trains, TADM:Post-train's
    # fusions on the post-train base once it is done): one process each, runtime.jobs at a time,
    # the longest first
    jobs = sorted(train_jobs(p, args), key=lambda job: -job[2])
    names = {name for name, _, _ in jobs}
    after = {k: v for k, v in posttrain_after(p).items() if k in names}
    seconds = runtime.run_jobs([(name, argv) for name, argv, _ in jobs], p.runtime.jobs, after=after)
    record = {"jobs": p.runtime.jobs, "threads_each": runtime.threads_per_job(p.runtime.jobs),
              "order": [name for name, _, _ in jobs], "seconds": {k: round(v, 1) for k, v in seconds.items()}}
    if not args.runs:
        from tadm.io import atomic_write_json

        atomic_write_json(JOBS_RECORD, record)
    print(json.dumps(record))


JOBS_RECORD = Path("metrics/train/jobs.json")


# jobs of the train stage that start only once others have finished: TADM:Post-train's fusion and
# its fresh-anchor control train on the frozen post-train base, and so do their replicates
# (posttrain.replicates; names dg_posttrain-s<seed>, dg_posttrain_fresh-s<seed>: posttrain_after)
TRAIN_AFTER = {"dg_posttrain": ("dg_base",), "dg_posttrain_fresh": ("dg_base",)}


def posttrain_after(p: config.Params) -> dict[str, tuple[str, ...]]:
    """TRAIN_AFTER with the fusion replicates of `p` (each after dg_base, like its main run)."""
    from tadm.posttrain.train import fusion_runs

    return {**TRAIN_AFTER, **{r.name: ("dg_base",) for fresh in (False, True) for r in fusion_runs(p, fresh)[1:]}}


def train_jobs(p: config.Params, args) -> list[tuple[str, list[str], float]]:
    """(name, command, cost) of each job of `python -m tadm train [runs...]`: the runs asked for, or
    with none every network the pipeline trains (train.models and the training replicates of
    train.replicate_models, the evaluator, the post-train base,
    TADM:Post-train's fusion and its fresh-anchor control (after the base, TRAIN_AFTER), the ASRD
    model, then the fusion's and the control's replicates of posttrain.replicates, also after the
    base: :func:`posttrain_after`). The cost is a proxy of the training FLOPs (tokens seen x layer passes x width^2) that
    orders the jobs longest first."""
    from tadm.errors import ConfigError
    from tadm.memory_estimate import layers
    from tadm.train.trainer import replicate_name, replicate_seeds

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
    from tadm.posttrain.train import fusion_runs

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


def cmd_evaluator(args) -> None:
    """Train the Gen PPL / MAUVE evaluator (eval.evaluator: trained) and measure its sanity checks."""
    from tadm.metrics import trained_evaluator as te

    p = _params(args)
    if te.TRAINED not in (p.eval.evaluator, p.eval.featurizer):
        # another evaluator (the paper profile's GPT-2 Large): record which, train nothing
        from tadm.io import atomic_write_json

        record = {"run": "evaluator", "evaluator": p.eval.evaluator, "featurizer": p.eval.featurizer, "trained": False}
        atomic_write_json(te.MODEL_DIR / "record.json", record)
        atomic_write_json(te.METRICS, record)
        Path("checkpoints/evaluator").mkdir(parents=True, exist_ok=True)  # a train-stage out: none to keep
        print(f"eval.evaluator = {p.eval.evaluator!r}, eval.featurizer = {p.eval.featurizer!r}: nothing to train")
        return
    summary = te.train(p, Path(args.data), Path(args.tokenizer), restart=args.restart)
    print(json.dumps(summary))


def cmd_claims(args) -> None:
    """paper_figures/claims.{md,csv}: every quantitative claim of the paper with a computed verdict."""
    from tadm.experiments import claims

    if args.from_ is not None:  # recomputed from a claims inputs file alone (no run, no params.yaml)
        cs = claims.write_from(Path(args.from_), out=Path(args.out))
    else:
        cs = claims.write(_params(args), out=Path(args.out))
    for c in cs:
        print(f"{c.verdict:>24}  {c.id}: {c.shown or '-'}")


def cmd_count(args) -> None:
    """Parameter counts of every model at the active profile, built on the meta device
    (nothing is allocated, no optimizer). Paper profile: TADM 224M + 38.85M training-only (its anchor LM head)."""
    import torch

    from tadm.models import build_model, count_parameters
    from tadm.registry import METHODS

    p = _params(args)
    vocab = args.vocab or p.tokenizer.vocab_size
    with torch.device("meta"):
        for kind in dict.fromkeys(unit.model.model_type for unit in METHODS.values()):
            m = build_model(kind, p.model, vocab, p.packing.seq_len)
            inference = getattr(m, "inference_parameters", None)  # a model with training-only parts
            if callable(inference):
                used = count_parameters(inference())
                print(f"{kind}: {used / 1e6:.2f}M unique inference parameters + "
                      f"{(count_parameters(m) - used) / 1e6:.2f}M training-only parameters")
            else:
                print(f"{kind}: {count_parameters(m) / 1e6:.2f}M parameters")
    from tadm.posttrain import fusion

    pt = p.posttrain
    d = pt.base.hidden_size if pt.base_model == "local" else fusion.DIFFUSIONGEMMA_HIDDEN
    with torch.device("meta"):
        here = fusion.PairedAttentionFusion(d, pt.fusion_rank).num_parameters
    paper = fusion.paper_size_count()
    print(f"posttrain fusion: {here / 1e6:.3f}M trainable parameters at d = {d}, r = {pt.fusion_rank} "
          f"(5dr + r + 1 + 3d); at DiffusionGemma-26B (d = {fusion.DIFFUSIONGEMMA_HIDDEN}, r = {fusion.PAPER_RANK}): "
          f"{paper / 1e6:.2f}M, the paper quotes ~{fusion.PAPER_QUOTED / 1e6:.1f}M, which 4dr + 3r^2 + 3d = 3.09M would give (tadm/posttrain/fusion.py)")


def cmd_sample(args) -> None:
    """Sample from a trained model (Alg. 1 for TADM) and print texts, compute and speed."""
    import torch

    from tadm.data.tokenizer import load_tokenizer
    from tadm.errors import ConfigError, DataError
    from tadm.models import load_pretrained
    from tadm.registry import METHODS, method_for
    from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

    p = _params(args)
    if args.refresh_every > args.steps:
        raise ConfigError("--refresh-every", f"must be <= --steps ({args.steps}; a larger K refreshes only at the "
                          f"start, as K = {args.steps} does), got {args.refresh_every}", "python -m tadm sample")
    model = load_pretrained(args.model)
    unit = method_for(model.model_type)
    if unit.adapter is None:
        diffusion = ", ".join(dict.fromkeys(u.model.model_type for u in METHODS.values() if u.adapter is not None))
        raise DataError(f"{args.model}: `tadm sample` runs the diffusion models ({diffusion}); "
                        f"AR samples with tadm.sampling.ar.sample_ar")
    refresh = FixedInterval(args.refresh_every) if unit.refreshes else None
    settings = SamplerSettings.from_config(p.sample, steps=args.steps, seed=args.seed,
                                           **({"sampler": args.sampler} if args.sampler else {}))
    with torch.no_grad():
        result = sample(make_adapter(model, refresh), settings, num_samples=args.num, seq_len=model.seq_len)
    tok = load_tokenizer(args.tokenizer)
    for i, ids in enumerate(result.tokens.tolist()):
        print(f"--- sample {i}\n{tok.decode(ids)}")
    c = result.counters
    print(json.dumps({"model": str(args.model), "settings": settings.as_dict(),
                      "layer_calls_per_trajectory": c.layer_calls_per_trajectory,
                      "anchor_calls": c.anchor_calls, "model_calls": c.model_calls,
                      "tokens_per_s": result.tokens_per_second}))


def cmd_compute_column(args) -> None:
    """Table 2's compute column at T = 2048 / 4096 from real sampling runs (paper depths)."""
    import csv
    import io

    import torch

    from tadm.errors import DataError
    from tadm.io import atomic_write_json, atomic_write_text
    from tadm.sampling.accounting import PAPER_REFRESH_SCHEDULE, compute_column, to_markdown

    # tiny models (width 32, one sequence): the count is per-call overhead, which one thread runs
    # 1.23x faster than two (benchmarks/results/threads.md)
    torch.set_num_threads(1)
    steps = args.steps or _params(args).sample.compute_column_steps
    unknown = [T for T in steps if T not in PAPER_REFRESH_SCHEDULE]
    if unknown:
        raise DataError(f"steps {unknown}: Table 2 has a refresh interval only for T in {sorted(PAPER_REFRESH_SCHEDULE)}")
    rows = []
    for row in compute_column(steps):
        rows.append(row)
        print(json.dumps(row))
    out = Path(args.out)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "table2_compute.csv", buf.getvalue())
    atomic_write_text(out / "table2_compute.md", to_markdown(rows))
    matches = all(r["published"] is None or r["published"] == r["layer_calls"] for r in rows)
    atomic_write_json(args.metrics, {f"T{r['T']}_{r['model']}": r["layer_calls"] for r in rows} | {"matches_paper": matches})
    print(to_markdown(rows))


def cmd_table1_speed(args) -> None:
    """Table 1's timing block --block B (tadm.experiments.table1.time_block): every main row on the
    block's own prompt batches and sampling seed, timed in turns, nothing scored."""
    from tadm.experiments import table1

    result = table1.time_block(_params(args), args.block, root=Path(args.root), sft_dir=Path(args.sft),
                               out=Path(args.out) if args.out else None, control=not args.no_control)
    print(json.dumps({"block": args.block, "seconds": round(result["seconds"], 1),
                      "throughput_x": {t: {k: round(v["throughput_x"], 3) for k, v in r["methods"].items()}
                                       for t, r in result["results"].items()}}))


def cmd_replicates(args) -> None:
    """The training replicates' draws: sample.replicate_rows from every replicate of their model
    (tadm.experiments.replicates)."""
    from tadm.data.tokenizer import load_tokenizer
    from tadm.experiments import replicates
    from tadm.experiments.table2 import Scorer

    p = _params(args)
    replicates.require_models(p)  # before the tokenizer and the judge are loaded
    replicates.run(p, Scorer(p, load_tokenizer(args.tokenizer), args.data))


def cmd_throughput(args) -> None:
    """Table 2's tokens/s (tadm.experiments.throughput). With --block B: timing block B alone (one
    process: every row that samples timed in turns from the block's batch seed and step window)
    written to --out. Without: the blocks in --blocks combined into --out and --table, each block
    first run in its own process when --run-blocks is given."""
    from tadm.errors import DataError
    from tadm.experiments import throughput, throughput_results
    from tadm.io import atomic_write_json

    p = _params(args)
    if args.block is not None:
        from tadm.data.tokenizer import load_tokenizer

        out = Path(args.out or throughput_results.block_path(args.block, args.blocks))
        result = throughput.run(p, models_dir=args.models, bos_id=load_tokenizer(args.tokenizer).bos_token_id,
                                rows=args.rows, out=out, block=args.block)
        if args.table:
            throughput_results.write_table(result, Path(args.table))
        print(json.dumps({"block": args.block, "out": str(out), "seconds": round(result["seconds"], 1)}))
        return
    if args.run_blocks:
        for b in range(p.sample.throughput_blocks):  # each block in its own process
            cmd = [sys.executable, "-m", "tadm", "--params", args.params, "throughput", "--block", str(b),
                   "--models", args.models, "--tokenizer", args.tokenizer, "--blocks", args.blocks, "--table", ""]
            if args.rows:
                cmd += ["--rows", *args.rows]
            if subprocess.run(cmd).returncode != 0:
                raise DataError(f"throughput: block {b} failed (its command: {' '.join(cmd)})")
    blocks = throughput_results.load_blocks(args.blocks)
    if len(blocks) != p.sample.throughput_blocks:
        raise DataError(f"{args.blocks} holds {len(blocks)} timing blocks, sample.throughput_blocks is "
                        f"{p.sample.throughput_blocks}: run the missing ones (python -m tadm throughput --block B)")
    result = throughput_results.combine(blocks, args.blocks)
    atomic_write_json(Path(args.out or throughput_results.OUT), result)
    throughput_results.write_table(result, Path(args.table or throughput_results.TABLE))
    for T, budget in result["budgets"].items():
        print(json.dumps({"T": int(T), "tokens_per_s": {r: round(b["tokens_per_s"], 1) for r, b in budget["rows"].items()},
                          "vs_adlm": {r: b["vs"].get("adlm", {}).get("ratio") for r, b in budget["rows"].items()}}))


def cmd_dg_base(args) -> None:
    """Train the default profile's small DiffusionGemma (posttrain.base_model: local)."""
    from tadm import runtime
    from tadm.data.tokenizer import load_tokenizer
    from tadm.posttrain.train import train_base

    p = _params(args)
    if p.posttrain.base_model != "local":
        # the paper profile starts from a released DiffusionGemma: record which, train nothing
        from tadm.io import atomic_write_json
        from tadm.posttrain.model import BASE_DIR

        Path("checkpoints/dg_base").mkdir(parents=True, exist_ok=True)
        atomic_write_json(BASE_DIR / "base.json", {"base_model": p.posttrain.base_model})
        atomic_write_json(Path("metrics/posttrain/dg_base.json"), {"run": "dg_base", "base_model": p.posttrain.base_model})
        print(f"posttrain.base_model = {p.posttrain.base_model!r}: loaded from there by dg-posttrain; nothing to train")
        return
    if _relaunched(p, args, "dg-base", "--sft", args.sft, "--tokenizer", args.tokenizer):
        return
    tok_name = args.tokenizer if p.sft.tokenizer == "project" else p.sft.tokenizer
    summary = train_base(p, load_tokenizer(tok_name), sft_dir=Path(args.sft), restart=args.restart)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def cmd_dg_posttrain(args) -> None:
    """TADM:Post-train: train the fusion of the frozen DiffusionGemma."""
    from tadm import runtime
    from tadm.posttrain.train import train_fusion

    p = _params(args)
    if args.replicate:
        from tadm.posttrain.train import fusion_run

        fusion_run(p, args.fresh_anchor, args.replicate)  # one line before any relaunch: is there such a replicate?
    if _relaunched(p, args, "dg-posttrain", "--sft", args.sft, *(["--fresh-anchor"] if args.fresh_anchor else []),
                   *(["--replicate", str(args.replicate)] if args.replicate else [])):
        return
    summary = train_fusion(p, sft_dir=Path(args.sft), restart=args.restart, fresh=args.fresh_anchor,
                           replicate=args.replicate)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def cmd_asrd_model(args) -> None:
    """Train the masked diffusion LM the ASRD comparison runs on (both tasks)."""
    from tadm import runtime
    from tadm.asrd.train import train
    from tadm.data.tokenizer import load_tokenizer

    p = _params(args)
    if _relaunched(p, args, "asrd-model", "--tokenizer", args.tokenizer):
        return
    summary = train(p, load_tokenizer(args.tokenizer), restart=args.restart)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def _add_setup_commands(sub) -> None:
    """Subcommands: the profile, the checks and the data stages."""
    p = sub.add_parser("profile", help="show the active profile or switch params.yaml to another")
    p.add_argument("name", nargs="?", help="default | paper | micro (see profiles/)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--force", action="store_true",
                     help="switch even though HEAD commits the results of another profile (`dvc repro` then "
                     "overwrites them here; a checkout of its own, git worktree add, keeps them)")
    how.add_argument("--restore", action="store_true",
                     help="bring the committed run back: params.yaml, dvc.lock and the outputs git tracks as HEAD "
                     "has them, then dvc checkout")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("check", help="validate params.yaml and estimate whether its models fit the machine's memory")
    p.set_defaults(func=cmd_check)

    for name, func, helptext, needs in (
        ("corpus", cmd_corpus, "build the pretraining corpus and its train/validation split", ()),
        ("tokenizer", cmd_tokenizer, "build the tokenizer (gpt2 offline, or train a BPE)", ("corpus",)),
        ("pack", cmd_pack, "pack the corpus into fixed-length token shards (MDLM wrap)", ("corpus", "tokenizer")),
        ("sft", cmd_sft, "build the post-training SFT mixture and its diffusion canvases", ("tokenizer",)),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--out", default=None, help="output directory")
        if "corpus" in needs:
            p.add_argument("--corpus", default=str(CORPUS_DIR))
        if "tokenizer" in needs:
            p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
        p.set_defaults(func=func)
    p = sub.add_parser("count", help="print every model's parameter count at the active profile")
    p.add_argument("--vocab", type=_key("tokenizer.vocab_size"), default=None,
                   help="vocabulary size (default: the tokenizer's; read as tokenizer.vocab_size)")
    p.set_defaults(func=cmd_count)


def _add_model_commands(sub) -> None:
    """Subcommands: sampling and training the pretraining networks and the evaluator."""
    p = sub.add_parser("sample", help="sample from a trained model (TADM reuses its anchor for K steps)")
    p.add_argument("model", help="a model directory, e.g. models/tadm")
    p.add_argument("--steps", type=_key("sample.budgets.T"), default=128, help="reverse steps T")
    p.add_argument("--refresh-every", type=_key("sample.budgets.K"), default=1,
                   help="TADM's anchor refresh interval K (<= --steps)")
    p.add_argument("--num", type=_key("sample.num_samples"), default=2, help="number of samples")
    p.add_argument("--seed", type=_key("seed"), default=0)
    p.add_argument("--sampler", type=_key("sample.sampler"), default=None, help="mdlm | remdm-cap | remdm-rescale | remdm-conf | remdm-loop | mdlm-fb | mdlm-dfm | "
                   "sedd-analytic (default: sample.sampler)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("compute-column", help="Table 2's compute column counted from real sampling runs at the "
                       "paper's depths (12/12/6 layers)")
    p.add_argument("--steps", type=_key("sample.compute_column_steps", entry=True), nargs="+", default=None,
                   help="sampling budgets T (default: sample.compute_column_steps)")
    p.add_argument("--out", default="paper_figures", help="directory for table2_compute.{md,csv}")
    p.add_argument("--metrics", default="metrics/compute_column.json")
    p.set_defaults(func=cmd_compute_column)

    p = sub.add_parser("train", help="train models (resumes if interrupted): one run of train.models in this process "
                       "(runtime.nproc > 1: as that many processes, torchrun); several runs, or none (the train "
                       "stage: train.models, the evaluator, the post-train base, the ASRD model), as one process "
                       "each, runtime.jobs at a time")
    p.add_argument("runs", nargs="*", help="mdlm | adlm | tadm | tadm_gamma0 | sedd | ar (default: train.models)")
    p.add_argument("--data", default=str(PACKED_DIR), help="packed token shards (pack stage output)")
    p.add_argument("--replicate", type=_block_index, default=0, metavar="K",
                   help="train the run's K-th training replicate (seed + K; 1 .. train.replicates - 1) under "
                   "checkpoints/replicates/<run>-s<seed>")
    _add_restart(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluator", help="train the small GPT-2 that scores samples (Gen PPL, MAUVE features) when "
                       "eval.evaluator is 'trained'; writes models/evaluator and metrics/evaluator.json")
    p.add_argument("--data", default=str(PACKED_DIR))
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    _add_restart(p)
    p.set_defaults(func=cmd_evaluator)


def _add_result_commands(sub) -> None:
    """Subcommands: the claims, replicates and timing stages."""
    p = sub.add_parser("claims", help="paper_figures/claims.{md,csv}: the paper's claims with verdicts computed from "
                       "this run's results")
    p.add_argument("--out", default="paper_figures")
    p.add_argument("--from", dest="from_", default=None, metavar="FILE",
                   help="recompute claims.{md,csv} and claims_summary.md from a claims inputs file "
                   "(paper_figures/claims_inputs.json) alone, instead of the run's outputs")
    p.set_defaults(func=cmd_claims)

    p = sub.add_parser("replicates", help="sample and score Table 2's compared rows (sample.replicate_rows) from every "
                       "training replicate of their model (samples/replicates, results/replicates)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    p.add_argument("--data", default=str(PACKED_DIR), help="packed token shards (the references and the Data row)")
    p.set_defaults(func=cmd_replicates)

    p = sub.add_parser("throughput", help="Table 2's tokens/s: with --block B one timing block (every row that samples "
                       "timed in turns in one process); without, the blocks combined (results/throughput.json, "
                       "paper_figures/table2_throughput.md)")
    p.add_argument("--block", type=_block_index, default=None,
                   help="time block B alone (0 <= B < sample.throughput_blocks) and write it to --out "
                        "(default: <--blocks>/block_B.json)")
    p.add_argument("--blocks", default=str(Path("results/throughput")), help="the timing blocks' folder")
    p.add_argument("--run-blocks", action="store_true",
                   help="run every block first, each in its own process (the pipeline runs them as stages)")
    p.add_argument("--models", default="models", help="the trained models' directory (models/<row's model>)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    p.add_argument("--out", default=None, help="default: results/throughput.json (a block: <--blocks>/block_B.json)")
    p.add_argument("--table", default=None, help="default: paper_figures/table2_throughput.md (a block: none)")
    p.add_argument("--rows", nargs="+", default=None, help="time only these Table 2 rows (default: every row that samples)")
    p.set_defaults(func=cmd_throughput)

    p = sub.add_parser("table1-speed", help="Table 1's timing block B: every main row timed in turns on the block's "
                       "own prompt batches and seed, nothing scored (results/table1_speed/block_B.json)")
    p.add_argument("--block", type=_block_index, required=True,
                   help="1 <= B < timing.table1_blocks (block 0 is the table1 stage's scored pass)")
    p.add_argument("--root", default=".", help="where models/dg_* are")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--out", default=None, help="default: <root>/results/table1_speed/block_B.json")
    p.add_argument("--no-control", action="store_true", help="leave out the fresh-anchor control (models/dg_fresh)")
    p.set_defaults(func=cmd_table1_speed)


def _add_posttrain_commands(sub) -> None:
    """Subcommands: TADM:Post-train, its base and the ASRD model."""
    p = sub.add_parser("dg-base", help="train the small DiffusionGemma of the default profile on the SFT canvases")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    _add_restart(p)
    p.set_defaults(func=cmd_dg_base)

    p = sub.add_parser("dg-posttrain", help="TADM:Post-train: train the fusion of a frozen DiffusionGemma "
                       "(runtime.nproc > 1: that many processes, global batch batch_size x grad_accum x nproc)")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--fresh-anchor", action="store_true",
                   help="train Table 1's control instead: the same recipe with the anchor recomputed at every step "
                   "(no reuse); writes models/dg_fresh")
    p.add_argument("--replicate", type=_block_index, default=0, metavar="K",
                   help="train the fusion's (with --fresh-anchor: the control's) K-th replicate (posttrain.seed + K; "
                   "1 .. posttrain.replicates - 1) under checkpoints/replicates/dg_posttrain[_fresh]-s<seed>, "
                   "models/replicates/dg_tadm-s<seed> (dg_fresh-s<seed>)")
    _add_restart(p)
    p.set_defaults(func=cmd_dg_posttrain)

    p = sub.add_parser("asrd-model", help="train the masked diffusion LM of the ASRD comparison on its two tasks "
                       "(arithmetic, word reversal)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    _add_restart(p)
    p.set_defaults(func=cmd_asrd_model)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="tadm", description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE.name), help="params file (default: params.yaml)")
    sub = ap.add_subparsers(dest="command", required=True)
    _add_setup_commands(sub)
    _add_model_commands(sub)
    _add_result_commands(sub)
    _add_posttrain_commands(sub)
    return ap


def output_paths(args) -> list[tuple[str, Path, str, tuple[str, ...] | None]]:
    """(flag, path, kind, ours) of every output path of the command in `args`: "file" or "dir"
    where that kind is written, `ours` the names a folder replaced as a whole may hold
    (tadm.io.output_conflict; None: files are written into it)."""
    command, out = args.command, getattr(args, "out", None)
    if command == "profile":
        return [("--params", Path(args.params), "file", None)]
    if command == "corpus":
        out = Path(out or CORPUS_DIR)
        return [("--out", out, "dir", None), *(("--out", out / name, "file", None)
                                               for name in ("train.jsonl", "validation.jsonl", "manifest.json"))]
    if command in ("sft", "claims"):
        return [("--out", Path(out or SFT_DIR), "dir", None)]
    if command == "tokenizer":
        from tadm.data.tokenizer import OUTPUT_FILES

        return [("--out", Path(out or TOKENIZER_DIR), "dir", OUTPUT_FILES)]
    if command == "pack":
        from tadm.data.packing import SHARD_FILES, SPLITS

        out = Path(out or PACKED_DIR)
        return [("--out", out, "dir", None), *(("--out", out / split, "dir", SHARD_FILES) for split in SPLITS),
                ("--out", out / "manifest.json", "file", None)]
    if command == "compute-column":
        return [("--out", Path(out), "dir", None), *(("--out", Path(out) / f"table2_compute.{ext}", "file", None)
                                                     for ext in ("csv", "md")),
                ("--metrics", Path(args.metrics), "file", None)]
    if command == "table1-speed":
        from tadm.experiments.table1_speed import SPEED_DIR, speed_block_path

        return [("--out", Path(out) if out else speed_block_path(args.block, Path(args.root) / SPEED_DIR), "file", None)]
    if command == "throughput":
        from tadm.experiments import throughput_results

        if args.block is not None:
            paths = [("--out", Path(out or throughput_results.block_path(args.block, args.blocks)), "file", None)]
        else:
            paths = [("--out", Path(out or throughput_results.OUT), "file", None)]
        if args.table or args.block is None:
            paths.append(("--table", Path(args.table or throughput_results.TABLE), "file", None))
        if args.block is not None or args.run_blocks:
            paths.append(("--blocks", Path(args.blocks), "dir", None))
        return paths
    return []


def check_outputs(args) -> None:
    """Refuse, before any work, an output flag naming an existing folder where a file is written,
    an existing file where a folder is, or a folder that is replaced and holds what its writer did
    not write: one ConfigError line naming the flag and the path (tadm.io.check_output_path)."""
    from tadm.io import check_output_path

    for flag, path, kind, ours in output_paths(args):
        check_output_path(path, kind, flag, f"python -m tadm {args.command}", ours)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_outputs(args)
        args.func(args)
    except TadmError as e:
        _leave_process_group_on(e)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        _leave_process_group_on(e)
        print("interrupted: outputs are written atomically; rerun the same command to redo the stage", file=sys.stderr)
        return 130
    except Exception as e:
        _leave_process_group_on(e)
        raise
    return 0


def _leave_process_group_on(error: BaseException) -> None:
    """In a torchrun process that joined the process group, end it now, entering no collective
    (`runtime.leave_on_error`: ``error: rank R: ...``); otherwise return. A group needs
    torch.distributed imported, so a command that never imported it does not import torch here."""
    if "torch.distributed" not in sys.modules:
        return
    from tadm import runtime

    if runtime.in_process_group():
        runtime.leave_on_error(error, runtime.exit_code_of(error))


if __name__ == "__main__":
    sys.exit(main())
