"""The pretraining commands: sampling a trained model, Table 2's compute column, training (one run,
or the train stage's job pool: `tadm.cli.train_pool`) and the evaluator."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tadm.cli import common
from tadm.cli.common import PACKED_DIR, TOKENIZER_DIR
from tadm.cli.train_pool import JOBS_RECORD, posttrain_after, train_jobs
from tadm.errors import ConfigError, DataError, TadmError
from tadm.registry import METHODS, method_for

# each command imports what it needs inside it: `python -m tadm <command>` then loads only that
# command's modules (torch and transformers take seconds to import)


def cmd_sample(args) -> None:
    """Sample from a trained model (Alg. 1 for TADM) and print texts, compute and speed."""
    import torch  # lazy: CLI start-up loads a command's modules only when it runs

    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.models import load_pretrained  # lazy: CLI start-up loads a command's modules only when it runs
    # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

    p = common.load_params(args)
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
    import torch  # lazy: CLI start-up loads a command's modules only when it runs

    from tadm.io import atomic_write_json, atomic_write_text  # lazy: CLI start-up loads a command's modules only when it runs
    # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.sampling.accounting import PAPER_REFRESH_SCHEDULE, compute_column, to_markdown

    # tiny models (width 32, one sequence): the count is per-call overhead, which one thread runs
    # 1.23x faster than two (benchmarks/results/threads.md)
    torch.set_num_threads(1)
    steps = args.steps or common.load_params(args).sample.compute_column_steps
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


def cmd_train(args) -> None:
    from tadm import runtime  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.train.trainer import train  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if args.replicate and len(args.runs) != 1:
        raise TadmError("python -m tadm train: --replicate needs exactly one run (e.g. `train tadm --replicate 1`)")
    if args.replicate and args.runs[0] not in p.train.replicate_models:
        raise ConfigError("--replicate", f"run {args.runs[0]!r} has no training replicates (train.replicate_models: "
                          f"{', '.join(p.train.replicate_models) or 'none'})", "python -m tadm train")
    if len(args.runs) == 1:
        replicate = ["--replicate", str(args.replicate)] if args.replicate else []
        if common.relaunched(p, args, "train", args.runs[0], "--data", args.data, *replicate):
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
        from tadm.io import atomic_write_json  # lazy: CLI start-up loads a command's modules only when it runs

        atomic_write_json(JOBS_RECORD, record)
    print(json.dumps(record))


def cmd_evaluator(args) -> None:
    """Train the Gen PPL / MAUVE evaluator (eval.evaluator: trained) and measure its sanity checks."""
    from tadm.metrics import trained_evaluator as te  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if te.TRAINED not in (p.eval.evaluator, p.eval.featurizer):
        # another evaluator (the paper profile's GPT-2 Large): record which, train nothing
        from tadm.io import atomic_write_json  # lazy: CLI start-up loads a command's modules only when it runs

        record = {"run": "evaluator", "evaluator": p.eval.evaluator, "featurizer": p.eval.featurizer, "trained": False}
        atomic_write_json(te.MODEL_DIR / "record.json", record)
        atomic_write_json(te.METRICS, record)
        Path("checkpoints/evaluator").mkdir(parents=True, exist_ok=True)  # a train-stage out: none to keep
        print(f"eval.evaluator = {p.eval.evaluator!r}, eval.featurizer = {p.eval.featurizer!r}: nothing to train")
        return
    summary = te.train(p, Path(args.data), Path(args.tokenizer), restart=args.restart)
    print(json.dumps(summary))


def add_commands(sub) -> None:
    """Subcommands: sampling and training the pretraining networks and the evaluator."""
    p = sub.add_parser("sample", help="sample from a trained model (TADM reuses its anchor for K steps)")
    p.add_argument("model", help="a model directory, e.g. models/tadm")
    p.add_argument("--steps", type=common.key_type("sample.budgets.T"), default=128, help="reverse steps T")
    p.add_argument("--refresh-every", type=common.key_type("sample.budgets.K"), default=1,
                   help="TADM's anchor refresh interval K (<= --steps)")
    p.add_argument("--num", type=common.key_type("sample.num_samples"), default=2, help="number of samples")
    p.add_argument("--seed", type=common.key_type("seed"), default=0)
    p.add_argument("--sampler", type=common.key_type("sample.sampler"), default=None, help="mdlm | remdm-cap | remdm-rescale | remdm-conf | remdm-loop | mdlm-fb | mdlm-dfm | "
                   "sedd-analytic (default: sample.sampler)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("compute-column", help="Table 2's compute column counted from real sampling runs at the "
                       "paper's depths (12/12/6 layers)")
    p.add_argument("--steps", type=common.key_type("sample.compute_column_steps", entry=True), nargs="+", default=None,
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
    p.add_argument("--replicate", type=common.block_index, default=0, metavar="K",
                   help="train the run's K-th training replicate (seed + K; 1 .. train.replicates - 1) under "
                   "checkpoints/replicates/<run>-s<seed>")
    common.add_restart(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluator", help="train the small GPT-2 that scores samples (Gen PPL, MAUVE features) when "
                       "eval.evaluator is 'trained'; writes models/evaluator and metrics/evaluator.json")
    p.add_argument("--data", default=str(PACKED_DIR))
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    common.add_restart(p)
    p.set_defaults(func=cmd_evaluator)
