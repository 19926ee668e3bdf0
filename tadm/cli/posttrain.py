"""The post-training commands: the default profile's DiffusionGemma base, TADM:Post-train's fusion
(and its fresh-anchor control, its replicates) and the ASRD comparison's masked diffusion LM."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tadm.cli import common
from tadm.cli.common import SFT_DIR, TOKENIZER_DIR

# each command imports what it needs inside it: `python -m tadm <command>` then loads only that
# command's modules (torch and transformers take seconds to import)


def cmd_dg_base(args) -> None:
    """Train the default profile's small DiffusionGemma (posttrain.base_model: local)."""
    from tadm import runtime  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.posttrain.train import train_base  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if p.posttrain.base_model != "local":
        # the paper profile starts from a released DiffusionGemma: record which, train nothing
        from tadm.io import atomic_write_json  # lazy: CLI start-up loads a command's modules only when it runs
        from tadm.posttrain.model import BASE_DIR  # lazy: CLI start-up loads a command's modules only when it runs

        Path("checkpoints/dg_base").mkdir(parents=True, exist_ok=True)
        atomic_write_json(BASE_DIR / "base.json", {"base_model": p.posttrain.base_model})
        atomic_write_json(Path("metrics/posttrain/dg_base.json"), {"run": "dg_base", "base_model": p.posttrain.base_model})
        print(f"posttrain.base_model = {p.posttrain.base_model!r}: loaded from there by dg-posttrain; nothing to train")
        return
    if common.relaunched(p, args, "dg-base", "--sft", args.sft, "--tokenizer", args.tokenizer):
        return
    tok_name = args.tokenizer if p.sft.tokenizer == "project" else p.sft.tokenizer
    summary = train_base(p, load_tokenizer(tok_name), sft_dir=Path(args.sft), restart=args.restart)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def cmd_dg_posttrain(args) -> None:
    """TADM:Post-train: train the fusion of the frozen DiffusionGemma."""
    from tadm import runtime  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.posttrain.train import train_fusion  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if args.replicate:
        from tadm.posttrain.train import fusion_run  # lazy: CLI start-up loads a command's modules only when it runs

        fusion_run(p, args.fresh_anchor, args.replicate)  # one line before any relaunch: is there such a replicate?
    if common.relaunched(p, args, "dg-posttrain", "--sft", args.sft, *(["--fresh-anchor"] if args.fresh_anchor else []),
                   *(["--replicate", str(args.replicate)] if args.replicate else [])):
        return
    summary = train_fusion(p, sft_dir=Path(args.sft), restart=args.restart, fresh=args.fresh_anchor,
                           replicate=args.replicate)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def cmd_asrd_model(args) -> None:
    """Train the masked diffusion LM the ASRD comparison runs on (both tasks)."""
    from tadm import runtime  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.asrd.train import train  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    if common.relaunched(p, args, "asrd-model", "--tokenizer", args.tokenizer):
        return
    summary = train(p, load_tokenizer(args.tokenizer), restart=args.restart)
    if not runtime.under_torchrun() or os.environ.get("RANK") == "0":
        print(json.dumps(summary))


def add_commands(sub) -> None:
    """Subcommands: TADM:Post-train, its base and the ASRD model."""
    p = sub.add_parser("dg-base", help="train the small DiffusionGemma of the default profile on the SFT canvases")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    common.add_restart(p)
    p.set_defaults(func=cmd_dg_base)

    p = sub.add_parser("dg-posttrain", help="TADM:Post-train: train the fusion of a frozen DiffusionGemma "
                       "(runtime.nproc > 1: that many processes, global batch batch_size x grad_accum x nproc)")
    p.add_argument("--sft", default=str(SFT_DIR))
    p.add_argument("--fresh-anchor", action="store_true",
                   help="train Table 1's control instead: the same recipe with the anchor recomputed at every step "
                   "(no reuse); writes models/dg_fresh")
    p.add_argument("--replicate", type=common.block_index, default=0, metavar="K",
                   help="train the fusion's (with --fresh-anchor: the control's) K-th replicate (posttrain.seed + K; "
                   "1 .. posttrain.replicates - 1) under checkpoints/replicates/dg_posttrain[_fresh]-s<seed>, "
                   "models/replicates/dg_tadm-s<seed> (dg_fresh-s<seed>)")
    common.add_restart(p)
    p.set_defaults(func=cmd_dg_posttrain)

    p = sub.add_parser("asrd-model", help="train the masked diffusion LM of the ASRD comparison on its two tasks "
                       "(arithmetic, word reversal)")
    p.add_argument("--tokenizer", default=str(TOKENIZER_DIR))
    common.add_restart(p)
    p.set_defaults(func=cmd_asrd_model)
