"""The result commands: the claims table, the training replicates' draws and the timing blocks of
Table 2 (throughput) and Table 1 (table1-speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tadm.cli import common
from tadm.cli.common import PACKED_DIR, SFT_DIR, TOKENIZER_DIR
from tadm.errors import DataError

# each command imports what it needs inside it: `python -m tadm <command>` then loads only that
# command's modules (torch and transformers take seconds to import)


def cmd_claims(args) -> None:
    """paper_figures/claims.{md,csv}: every quantitative claim of the paper with a computed verdict."""
    from tadm.experiments import claims  # lazy: CLI start-up loads a command's modules only when it runs

    if args.from_ is not None:  # recomputed from a claims inputs file alone (no run, no params.yaml)
        cs = claims.write_from(Path(args.from_), out=Path(args.out))
    else:
        cs = claims.write(common.load_params(args), out=Path(args.out))
    for c in cs:
        print(f"{c.verdict:>24}  {c.id}: {c.shown or '-'}")


def cmd_replicates(args) -> None:
    """The training replicates' draws: sample.replicate_rows from every replicate of their model
    (tadm.experiments.replicates)."""
    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.experiments import replicates  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.experiments.table2 import Scorer  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    replicates.require_models(p)  # before the tokenizer and the judge are loaded
    replicates.run(p, Scorer(p, load_tokenizer(args.tokenizer), args.data))


def cmd_throughput(args) -> None:
    """Table 2's tokens/s (tadm.experiments.throughput). With --block B: timing block B alone (one
    process: every row that samples timed in turns from the block's batch seed and step window)
    written to --out. Without: the blocks in --blocks combined into --out and --table, each block
    first run in its own process when --run-blocks is given."""
    from tadm.experiments import throughput, throughput_results  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.io import atomic_write_json  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if args.block is not None:
        from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs

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


def cmd_table1_speed(args) -> None:
    """Table 1's timing block --block B (tadm.experiments.table1.time_block): every main row on the
    block's own prompt batches and sampling seed, timed in turns, nothing scored."""
    from tadm.experiments import table1  # lazy: CLI start-up loads a command's modules only when it runs

    result = table1.time_block(common.load_params(args), args.block, root=Path(args.root), sft_dir=Path(args.sft),
                               out=Path(args.out) if args.out else None, control=not args.no_control)
    print(json.dumps({"block": args.block, "seconds": round(result["seconds"], 1),
                      "throughput_x": {t: {k: round(v["throughput_x"], 3) for k, v in r["methods"].items()}
                                       for t, r in result["results"].items()}}))


def add_commands(sub) -> None:
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
    p.add_argument("--block", type=common.block_index, default=None,
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
    p.add_argument("--block", type=common.block_index, required=True,
                   help="1 <= B < timing.table1_blocks (block 0 is the table1 stage's scored pass)")
    p.add_argument("--root", default=".", help="where models/dg_* are")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--out", default=None, help="default: <root>/results/table1_speed/block_B.json")
    p.add_argument("--no-control", action="store_true", help="leave out the fresh-anchor control (models/dg_fresh)")
    p.set_defaults(func=cmd_table1_speed)
