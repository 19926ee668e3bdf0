"""Inputs of the experiments tests: the micro data, tiny random models of the project saved like
trained ones, a tiny random GPT-2 as evaluator and featurizer (the paper profile's code path:
one model for both, last-token features), and a post-train workspace (SFT data, a tiny
DiffusionGemma with a fusion, the ASRD masked model) for Table 1 and the ASRD comparison.

Everything runs single-threaded: the in-process runs are compared bit for bit with torchrun
workers, which run with one thread each (torchrun's OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import micro_raw, save_tiny_gpt2, torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)

EVAL_POSITIONS = 48  # shorter than some decoded samples: the further-chunk path of Gen PPL runs too


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    from tadm.config import ROOT

    out["PYTHONPATH"] = str(ROOT)
    return out


@pytest.fixture(scope="session")
def evaluator_dir(tmp_path_factory) -> Path:
    """A random 2-layer GPT-2 with the real GPT-2 tokenizer, saved with save_pretrained."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-evaluator"), EVAL_POSITIONS)


def random_model(kind: str, vocab: int, seq_len: int, seed: int = 0):
    from tadm.config import ModelConfig
    from tadm.models import build_model

    cfg = ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
    model = build_model(kind, cfg, vocab, seq_len)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a fresh DiT predicts uniformly (zero head): give it opinions
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="session")
def table2_workspace(micro_packed, evaluator_dir, tmp_path_factory) -> Path:
    """models/{mdlm,tadm,ar} (random, the micro vocabulary and canvas) next to the micro data."""
    root = tmp_path_factory.mktemp("table2")
    counts = json.loads((micro_packed / "manifest.json").read_text())["counts"]
    for i, kind in enumerate(("mdlm", "tadm", "ar")):
        random_model(kind, counts["vocab_size"], counts["seq_len"], seed=i).save_pretrained(root / "models" / kind)
    return root


def table2_raw(workspace: Path, evaluator_dir: Path, **overrides) -> dict:
    return micro_raw(**{"runtime.device": "cpu", "eval.featurizer": str(evaluator_dir),
                        "eval.evaluator": str(evaluator_dir), "eval.cache_dir": str(workspace / "cache"),
                        "eval.reference_samples": 6, "sample.num_samples": 6, "sample.budgets": [{"T": 8, "K": 4}, {"T": 16, "K": 4}], **overrides})


@pytest.fixture(scope="session")
def posttrain_workspace(micro_packed, tmp_path_factory) -> Path:
    """A directory laid out like the repository for Table 1 and the ASRD comparison: the
    tokenizer, the SFT data, a tiny random DiffusionGemma base with a fusion and a fresh-anchor
    control's fusion, and the ASRD
    masked model (trained for the micro profile's 4 steps)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm import config
    from tadm.asrd.train import train as train_asrd
    from tadm.data import sft
    from tadm.data.tokenizer import load_tokenizer
    from tadm.posttrain import model as dgm
    from tadm.posttrain.train import fusion_runs
    from tests.posttrain.conftest import tiny_config

    root = tmp_path_factory.mktemp("posttrain")
    shutil.copytree(micro_packed.parent / "tokenizer", root / "data" / "tokenizer")
    p = config.from_dict(posttrain_raw())
    tok = load_tokenizer(root / "data" / "tokenizer")
    sft.build(p, tok, root / "data" / "sft")
    torch.manual_seed(0)
    pt = p.posttrain
    layers = pt.shared_layers + pt.anchor_layers + pt.denoiser_layers
    base = DiffusionGemmaForBlockDiffusion(tiny_config(layers, vocab=len(tok), canvas=pt.canvas_length)).eval()
    base.save_pretrained(root / dgm.BASE_DIR)
    tok.save_pretrained(root / dgm.BASE_DIR)
    # TADM's fusion and Table 1's fresh-anchor control, every run of each (posttrain.replicates),
    # perturbed (the up-projection starts at zero: make TADM differ from the base)
    for fresh in (False, True):
        for run in fusion_runs(p, fresh, root):
            model = dgm.build_tadm(base, p, fresh=fresh)
            with torch.no_grad():
                for q in model.fusion.parameters():
                    q.add_(0.05 * torch.randn_like(q))
            dgm.save_fusion(model, run.model, "local")
    train_asrd(p, tok, root, log=lambda *_: None)
    return root


def posttrain_raw(**overrides) -> dict:
    # timing.table1_blocks 1: Table 1's speed from its scored pass alone (test_table1_speed times blocks)
    return micro_raw(**{"runtime.device": "cpu", "posttrain.eval_batch_size": 3, "sft.validation_fraction": 0.3,
                        "timing.table1_blocks": 1, **overrides})
