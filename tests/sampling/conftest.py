"""Tiny random models for the sampling tests.

Every parameter is drawn from N(0, 0.1^2): a fresh DiT is the identity with a zero output head,
so without this every prediction would be uniform. The tests run single-threaded: the models
are so small that each op costs microseconds, and OpenMP threads only add contention.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import torch_single_thread

from tadm.config import ModelConfig
from tadm.models import build_model

V = 50  # vocabulary; the mask id is V
TINY = ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
PAPER_DEPTH = ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=12, anchor_layers=12, denoiser_layers=6)


def random_model(kind: str, cfg: ModelConfig = TINY, seq_len: int = 16, seed: int = 0) -> torch.nn.Module:
    model = build_model(kind, cfg, V, seq_len)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
