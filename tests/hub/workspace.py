"""A tiny workspace for `tadm.hub.export`: params.yaml (the repository's, with a tiny model),
metrics/train/<run>.json, data/packed/manifest.json, data/tokenizer (a word-level tokenizer of V
tokens) and models/<run> (a random network). Nothing is trained; nothing reaches a hub."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import yaml

from tadm import config
from tadm.config import ROOT
from tadm.models import build_model
from tadm.registry import METHODS

V, L = 37, 16
RUNS = ("mdlm", "sedd", "adlm", "tadm", "tadm_gamma0", "ar")
TINY = config.ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)


def tiny_net(kind: str, vocab: int = V, seq_len: int = L, seed: int = 0, std: float = 0.1):
    """A network of `kind` with every weight drawn from N(0, std^2) (a fresh model's zero-initialised
    heads would make every logit equal), in eval mode."""
    torch.manual_seed(seed)
    net = build_model(kind, TINY, vocab, seq_len)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=std)
    return net.eval()


def write_tokenizer(directory: Path, vocab: int = V) -> Path:
    """A word-level tokenizer of `vocab` tokens: id 0 "<|endoftext|>" (BOS = EOS), then w1, w2, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "backend": "tokenizers", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "model_max_length": 10**30, "tokenizer_class": "TokenizersBackend", "unk_token": "<|endoftext|>"}))
    return directory


def make_workspace(root: Path, runs=RUNS, vocab: int = V, seq_len: int = L) -> Path:
    """The workspace under `root` (returned): the files export reads, one random model per run."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["model"] = dataclasses.asdict(TINY)
    (root / "params.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    counts = {"bos_id": 0, "eos_id": 0, "dtype": "uint16", "seq_len": seq_len, "vocab_size": vocab,
              "train": {"sequences": 100, "shards": 1, "tokens": 100 * seq_len},
              "validation": {"sequences": 10, "shards": 1, "tokens": 10 * seq_len}}
    (root / "data" / "packed").mkdir(parents=True, exist_ok=True)
    (root / "data" / "packed" / "manifest.json").write_text(json.dumps(
        {"counts": counts, "params": {"seq_len": seq_len}, "sha256": {}, "stage": "pack"}))
    write_tokenizer(root / "data" / "tokenizer", vocab)
    (root / "metrics" / "train").mkdir(parents=True, exist_ok=True)
    for i, run in enumerate(runs):
        family = METHODS[run].model.model_type
        net = tiny_net(family, vocab, seq_len, seed=i)
        net.save_pretrained(root / "models" / run)
        (root / "metrics" / "train" / f"{run}.json").write_text(json.dumps({
            "run": run, "model_type": family, "seed": 0, "steps": 10, "parameters": sum(p.numel() for p in net.parameters()),
            "val_nelbo": 3.25 + i, "val_ppl_bound": 25.79, "below_unigram": 0.5, "unigram_entropy": 3.6,
            "val_nelbo_init": 3.6, "train_tokens_per_s": 1.0}))
    return root


def export_all(root: Path, runs=RUNS) -> dict[str, Path]:
    """Each run of `runs` exported to <root>/hub/<run>."""
    from tadm.hub.export import export

    return {run: export(root / "models" / run, root / "hub" / run, params=root / "params.yaml") for run in runs}
