"""A training step issues no host sync: the readouts gather a fixed number of rows
(tadm.losses.Readout with a capacity, tadm.forward_process.masked_rows_capacity), so nothing
reads a count, a boolean mask or a scalar back from the device between the steps' periodic
checks. Also the capacity itself: its closed form, that the gather gives the boolean mask's
values, and that an overflow yields NaN (never a sum over fewer rows) and stops the run with its
own error."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tadm import config, losses
from tadm.forward_process import mask_tokens, masked_rows_capacity, sample_times, stale_pair
from tadm.methods import get_method
from tadm.schedule import LogLinearSchedule
from tadm.train.divergence import CapacityExceeded, FiniteWatch
from tadm.train.trainer import EMA
from tests.conftest import micro_raw

# ops that make the host wait for the device: a value read back (item, bool, int, float), or an
# output whose shape depends on values (boolean-mask indexing, nonzero, masked_select, ...)
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "masked_scatter", "repeat_interleave",
           "_unique2", "unique_dim", "unique_consecutive", "equal", "is_nonzero"}


class NoSync(TorchDispatchMode):
    """Fails on the first op that would sync a CUDA stream with the host (see SYNCING; an index
    by a boolean tensor is a nonzero in disguise)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING:
            raise AssertionError(f"host sync in the step: aten.{name}")
        if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                raise AssertionError(f"host sync in the step: aten.{name} by a boolean mask")
        return func(*args, **(kwargs or {}))


def test_the_checker_catches_each_kind_of_sync():
    x = torch.arange(6.0)
    for sync in (lambda: x.sum().item(), lambda: x[x > 2], lambda: bool(x.any()), lambda: (x > 2).nonzero(),
                 lambda: x.masked_select(x > 1), lambda: float(x[0])):
        with pytest.raises(AssertionError, match="host sync"), NoSync():
            sync()


SIZES = {"model.d_model": 32, "model.n_heads": 2, "model.mlp_ratio": 2, "model.mdlm_layers": 2,
         "model.anchor_layers": 2, "model.denoiser_layers": 1}
V, L, B = 29, 64, 32  # the default profile's batch and length: capacity 1,247 < B L = 2,048


@pytest.mark.parametrize("run", ["mdlm", "sedd", "adlm", "tadm", "tadm_gamma0", "ar"])
@pytest.mark.parametrize("keep_heads", [False, True])
def test_a_training_step_never_syncs(run, keep_heads):
    """The trainer's step on the CPU, op for op as on a GPU (fused AdamW, the trainer's GPU
    optimizer): loss, backward, clipping, the optimizer, the EMA and the divergence watch."""
    p = config.from_dict(micro_raw(**SIZES))
    method = get_method(run, p)
    method.checkpoint_heads = not keep_heads
    torch.manual_seed(0)
    model = method.build_model(V, L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ema, watch = EMA(model, 0.999), FiniteWatch(run, torch.device("cpu"))
    x = torch.randint(V, (B, L), generator=torch.Generator().manual_seed(1))
    assert masked_rows_capacity(B, L, 1e-3) < B * L  # the gather path, not the every-row one
    for step in range(2):  # the second step with AdamW's state in place
        gen = torch.Generator().manual_seed(step)
        with NoSync():
            loss = method.loss(model, x, gen, progress=0.5).float().sum() / x.numel()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema.update(model)
            watch.observe(step + 1, loss.detach().double(), grad_norm, method.take_excess())
    watch.check(1, "unused")  # the periodic check: one read, nothing recorded
    assert torch.isfinite(loss)


def _readout_case(seed: int = 0, n_rows: int = 6, d: int = 8, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(n_rows, 10, generator=g) < 0.4
    targets = torch.randint(vocab, rows.shape, generator=g)
    h = torch.randn(*rows.shape, d, generator=g, requires_grad=True)
    head = torch.nn.Linear(d, vocab + 1)
    return rows, targets, h, head, vocab


@pytest.mark.parametrize("extra", [0, 1, 17])
def test_the_gather_gives_the_boolean_masks_values_and_gradients(extra):
    rows, targets, h, head, vocab = _readout_case()
    n = int(rows.sum())
    out = {}
    for capacity in (None, n + extra):
        h.grad, head.weight.grad = None, None
        r = losses.subs_readout(torch.where(rows, vocab, targets), targets, vocab, checkpoint=False,
                                capacity=capacity)
        value = r(h, head)
        value.sum().backward()
        out[capacity] = value.detach(), h.grad.clone(), head.weight.grad.clone()
    # the reference: the boolean mask (what the readout did before it gathered a fixed size)
    reference = torch.zeros(rows.shape).masked_scatter(
        rows, torch.nn.functional.cross_entropy(head(h[rows])[:, :vocab], targets[rows], reduction="none")).sum(-1)
    assert torch.allclose(out[None][0], reference.detach(), atol=1e-6)
    assert torch.equal(out[n + extra][0], out[None][0])  # the same rows in the same order: bit for bit
    for a, b in zip(out[n + extra][1:], out[None][1:]):
        assert torch.allclose(a, b, atol=1e-6)
    assert not out[n + extra][1][~rows].any()  # a padding row gets no gradient


def test_an_overflowing_readout_is_nan_and_says_by_how_much():
    rows, targets, h, head, vocab = _readout_case()
    n = int(rows.sum())
    r = losses.subs_readout(torch.where(rows, vocab, targets), targets, vocab, capacity=n - 3)
    assert torch.isnan(r(h, head)).all()
    assert int(r.excess) == 3
    fit = losses.subs_readout(torch.where(rows, vocab, targets), targets, vocab, capacity=n)
    assert int(fit.excess) == 0 and torch.isfinite(fit(h, head)).all()
    with pytest.raises(ValueError, match="capacity"):
        losses.subs_readout(rows, targets, vocab, capacity=0)


def test_the_trainer_stops_on_an_overflow_with_its_own_error(monkeypatch):
    """A capacity too small for the draw: the watch names the step and the rows past it."""
    p = config.from_dict(micro_raw(**SIZES))
    method = get_method("mdlm", p)
    model = method.build_model(V, L)
    monkeypatch.setattr("tadm.methods.base.masked_rows_capacity", lambda *a, **k: 5)
    watch = FiniteWatch("mdlm", torch.device("cpu"))
    x = torch.randint(V, (B, L), generator=torch.Generator().manual_seed(1))
    loss = method.loss(model, x, torch.Generator().manual_seed(0)).sum()
    excess = method.take_excess()
    assert method.take_excess() is None  # taken: forgotten
    watch.observe(7, loss.detach().double(), torch.ones(()), excess)
    with pytest.raises(CapacityExceeded, match=r"at step 7 scored \d+ rows more than its capacity"):
        watch.check(1, "the last good checkpoint is step 5")


def test_masked_rows_capacity_closed_form():
    # L min(B, (B+1)/2 + B (eps + shift)) + sqrt(B L ln(1e15) / 2), rounded up
    assert masked_rows_capacity(16, 1024, 1e-3) == math.ceil(1024 * (8.5 + 0.016) + math.sqrt(16384 * math.log(1e15) / 2))
    assert masked_rows_capacity(16, 1024, 1e-3) == 9253
    assert masked_rows_capacity(32, 64, 1e-3) == 1247
    assert masked_rows_capacity(16, 1024, 1e-3, 7 / 128) > masked_rows_capacity(16, 1024, 1e-3)
    assert masked_rows_capacity(2, 8, 1e-3) == 16  # capped at B L
    for bad in ((0, 8, 1e-3), (2, 0, 1e-3)):
        with pytest.raises(ValueError, match="positive batch"):
            masked_rows_capacity(*bad)


@pytest.mark.parametrize("failure", [0.2, 0.02])
def test_masked_rows_capacity_holds_on_draws(failure):
    """Hoeffding's bound is a bound: over many draws of the training noise (antithetic times,
    TADM's stale pair at the paper's choices), the fraction of draws past the capacity at
    `failure` stays below `failure` (for z_t and z_t')."""
    B_, L_, eps, draws = 8, 32, 1e-3, 3000
    schedule, g = LogLinearSchedule(eps), torch.Generator().manual_seed(0)
    refresh, budget = (1, 2, 4, 8), (64, 128)
    shift = (max(refresh) - 1) / min(budget)
    cap, cap_stale = masked_rows_capacity(B_, L_, eps, failure=failure), masked_rows_capacity(B_, L_, eps, shift, failure)
    assert cap < cap_stale < B_ * L_
    x = torch.zeros(B_, L_, dtype=torch.long)
    over = over_stale = 0
    for _ in range(draws):
        t = sample_times(B_, eps, True, g)
        over += int(mask_tokens(x, schedule.alpha(t), 1, g).eq(1).sum()) > cap
        pair = stale_pair(x, t, schedule, 1, refresh, budget, g)
        over_stale += int(pair.z_tprime.eq(1).sum()) > cap_stale
    assert over / draws <= failure and over_stale / draws <= failure
