"""The setup commands: the profile (show, switch, restore), the params and memory check, the data
stages (corpus, tokenizer, pack, sft) and the parameter count."""

from __future__ import annotations

import json
from pathlib import Path

from tadm import config
from tadm.cli import common
from tadm.cli.common import CORPUS_DIR, SFT_DIR, TOKENIZER_DIR, PACKED_DIR
from tadm.errors import ConfigError
from tadm.registry import METHODS

# each command imports what it needs inside it: `python -m tadm <command>` then loads only that
# command's modules (torch and transformers take seconds to import)


def cmd_profile(args) -> None:
    """Show the active profile, or switch params.yaml to another: refused (one line) where HEAD
    commits the results of another profile, unless --force; --restore brings the committed run
    back (tadm.config._switch)."""
    from tadm.config import _switch  # lazy: CLI start-up loads a command's modules only when it runs

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
    from tadm import memory_estimate as me  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.experiments import replicates  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
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
    from tadm.data import corpus  # lazy: CLI start-up loads a command's modules only when it runs

    m = corpus.build(common.load_params(args).corpus, args.out or CORPUS_DIR)
    print(json.dumps(m["counts"]))


def cmd_tokenizer(args) -> None:
    from tadm.data import tokenizer  # lazy: CLI start-up loads a command's modules only when it runs

    m = tokenizer.build(common.load_params(args).tokenizer, args.corpus, args.out or TOKENIZER_DIR)
    print(json.dumps(m["counts"]))


def cmd_pack(args) -> None:
    from tadm.data import packing  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs

    m = packing.build(common.load_params(args).packing, args.corpus, load_tokenizer(args.tokenizer), args.out or PACKED_DIR)
    print(json.dumps(m["counts"]))


def cmd_sft(args) -> None:
    from tadm.data import sft  # lazy: CLI start-up loads a command's modules only when it runs
    from tadm.data.tokenizer import load_tokenizer  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
    tok_name = args.tokenizer if p.sft.tokenizer == "project" else p.sft.tokenizer
    m = sft.build(p, load_tokenizer(tok_name), Path(args.out or SFT_DIR))
    print(json.dumps(m["counts"]))


def cmd_count(args) -> None:
    """Parameter counts of every model at the active profile, built on the meta device
    (nothing is allocated, no optimizer). Paper profile: TADM 224M + 38.85M training-only (its anchor LM head)."""
    import torch  # lazy: CLI start-up loads a command's modules only when it runs

    from tadm.models import build_model, count_parameters  # lazy: CLI start-up loads a command's modules only when it runs

    p = common.load_params(args)
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
    from tadm.posttrain import fusion  # lazy: CLI start-up loads a command's modules only when it runs

    pt = p.posttrain
    d = pt.base.hidden_size if pt.base_model == "local" else fusion.DIFFUSIONGEMMA_HIDDEN
    with torch.device("meta"):
        here = fusion.PairedAttentionFusion(d, pt.fusion_rank).num_parameters
    paper = fusion.paper_size_count()
    print(f"posttrain fusion: {here / 1e6:.3f}M trainable parameters at d = {d}, r = {pt.fusion_rank} "
          f"(5dr + r + 1 + 3d); at DiffusionGemma-26B (d = {fusion.DIFFUSIONGEMMA_HIDDEN}, r = {fusion.PAPER_RANK}): "
          f"{paper / 1e6:.2f}M, the paper quotes ~{fusion.PAPER_QUOTED / 1e6:.1f}M, which 4dr + 3r^2 + 3d = 3.09M would give (tadm/posttrain/fusion.py)")


def add_commands(sub) -> None:
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
    p.add_argument("--vocab", type=common.key_type("tokenizer.vocab_size"), default=None,
                   help="vocabulary size (default: the tokenizer's; read as tokenizer.vocab_size)")
    p.set_defaults(func=cmd_count)
