"""Hand-made and tiny real models for the ASRD tests."""

import pytest
import torch

from tadm.asrd.backends import Backend
from tests.conftest import torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)


class TableBackend(Backend):
    """A hand-made 'model' that reads every position: logits = input embedding . table^T.

    The prediction at a position is the token whose embedding is most aligned with what the
    position was fed, so a token fed as itself predicts itself (if its row has the largest
    norm among the aligned ones), and a push of the input can make it flip."""

    reads_decided = True

    def __init__(self, table: torch.Tensor, mask_id: int | None = None):
        super().__init__()
        self.table = table.double()
        self.vocab_size = table.shape[0] - (mask_id is not None)
        self.mask_id = mask_id
        self.inputs: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    @property
    def device(self):
        return torch.device("cpu")

    def embed(self, ids):
        return self.table[ids]

    def fill(self, z, undecided, generator):
        return z.masked_fill(undecided, self.mask_id if self.mask_id is not None else 0)

    def logits(self, ids, delta=None):
        self.inputs.append((ids.clone(), None if delta is None else delta.clone()))
        e = self.embed(ids) if delta is None else self.embed(ids) + delta
        self._advance(False)
        return (e @ self.table[: self.vocab_size].T).float()


@pytest.fixture
def tiny_models():
    """Random tiny MDLM and TADM (the real classes): vocab 11 + mask, length 12."""
    from tadm.config import ModelConfig
    from tadm.models import build_model

    cfg = ModelConfig(d_model=16, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
    torch.manual_seed(0)
    models = {kind: build_model(kind, cfg, 11, 12).eval() for kind in ("mdlm", "tadm")}
    with torch.no_grad():  # DiT heads start at zero (uniform predictions): give them opinions
        for model in models.values():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return models


@pytest.fixture(scope="module")
def tiny_base():
    from transformers import DiffusionGemmaForBlockDiffusion

    from tests.posttrain.conftest import tiny_config

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(tiny_config(layers=4)).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def dg_split(tiny_base):
    from tadm.posttrain.backbone import SplitDiffusionGemma

    return SplitDiffusionGemma(tiny_base, 1, 2, 1)
