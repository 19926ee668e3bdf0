"""train.residual: under bf16 autocast the DiT blocks' residual stream stays in bf16 when asked
(Megatron-LM's default) and in fp32 otherwise (MDLM's); the loss and gradients agree within bf16
tolerance; the setting needs train.precision bf16."""

import pytest
import torch

from tadm import config
from tadm.errors import ConfigError
from tadm.methods import get_method
from tadm.models.dit import DiTBlock, set_autocast_residual
from tests.conftest import micro_raw


def _step(run: str, residual: bool):
    """(loss, gradients, the dtypes every DiT block's input had) of one bf16-autocast step."""
    p = config.from_dict(micro_raw())
    method = get_method(run, p)
    torch.manual_seed(0)
    model = method.build_model(40, 16)
    for w in model.parameters():  # off the zero init of the gates and heads: every path carries signal
        torch.nn.init.normal_(w, std=0.05)
    set_autocast_residual(model, residual)
    seen = []
    hooks = [m.register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
             for m in model.modules() if isinstance(m, DiTBlock)]
    x = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = method.loss(model, x, torch.Generator().manual_seed(2)).float().mean()
    loss.backward()
    for h in hooks:
        h.remove()
    return loss.detach(), [w.grad.clone() for w in model.parameters() if w.grad is not None], set(seen)


@pytest.mark.parametrize("run", ["mdlm", "tadm", "adlm", "sedd", "ar"])
def test_a_bf16_residual_stream_stays_bf16_and_matches_the_fp32_stream(run):
    loss32, grads32, dtypes32 = _step(run, False)
    loss16, grads16, dtypes16 = _step(run, True)
    # (ADLM's denoiser stream starts from a bf16 Linear of the anchor's output either way)
    assert torch.float32 in dtypes32 and dtypes16 == {torch.bfloat16}
    assert torch.isfinite(loss16) and abs(loss16 - loss32) <= 2e-2 * abs(loss32)
    flat32, flat16 = torch.cat([g.flatten() for g in grads32]), torch.cat([g.flatten() for g in grads16])
    assert torch.isfinite(flat16).all()
    assert torch.nn.functional.cosine_similarity(flat32, flat16, dim=0) > 0.99


def test_outside_autocast_the_setting_changes_nothing():
    p = config.from_dict(micro_raw())
    method = get_method("tadm", p)
    torch.manual_seed(0)
    model = method.build_model(40, 16).eval()
    x = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = method.nelbo(model, x, torch.Generator().manual_seed(2))
        set_autocast_residual(model, True)
        after = method.nelbo(model, x, torch.Generator().manual_seed(2))
    assert torch.equal(before, after)


def test_a_bf16_residual_needs_bf16_precision():
    with pytest.raises(ConfigError, match="train.residual"):
        config.from_dict(micro_raw(**{"train.residual": "bf16", "train.precision": "fp32"}))
    config.from_dict(micro_raw(**{"train.residual": "bf16", "train.precision": "bf16"}))
