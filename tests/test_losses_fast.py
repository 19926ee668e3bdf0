"""The training objectives on scored rows only (tadm.losses.Readout) against the full-logits
definitions: equal values and gradients for MDLM, ADLM, TADM (gamma > 0 and 0) and SEDD, the
LM head run on the masked rows only, nothing (B, L, V+1)-sized kept for backward, AR's chunked
cross-entropy, and a 2-process DDP step."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch

from tadm import config
from tadm import losses
from tadm.forward_process import StalePair
from tadm.schedule import LogLinearSchedule
from tadm.losses import (
    adlm_anchor_loss, ar_nll, mdlm_nelbo, sedd_score_entropy, subs_log_probs, subs_readout, t_anelbo,
)
from tadm import methods
from tadm.methods import get_method
from tests.conftest import micro_raw

V, L, B = 23, 12, 5
MASK = V
GAMMA = 0.3
SMALL = {"model.d_model": 32, "model.n_heads": 2, "model.mlp_ratio": 2, "model.mdlm_layers": 2,
         "model.anchor_layers": 2, "model.denoiser_layers": 1, "train.gamma": GAMMA}
RUNS = ["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd"]


def _randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Well-scaled noise in every parameter (a fresh DiT has zero gates and a zero head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise / p.shape[-1] ** 0.5 if p.dim() >= 2 else (1 + 0.1 * noise if "norm" in name else 0.1 * noise))
    return model


def _draws(seed: int = 0):
    """x, t, z_t, and a stale pair, by hand: row 0 all masked, row 1 none masked, the rest mixed;
    z_t' masks z_t's masked positions and more. Tokens repeat (x in 0..V-1 over a short
    alphabet on row 4) so ADLM's important-token filter drops some rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (B, L), generator=g)
    x[4] = torch.tensor([3, 3, 3, 3, 3, 3, 3, 5, 5, 7, 3, 5])
    masked = torch.rand(B, L, generator=g) < 0.5
    masked[0], masked[1] = True, False
    z_t = torch.where(masked, MASK, x)
    masked_p = masked | (torch.rand(B, L, generator=g) < 0.3)
    masked_p[1, :3] = True
    z_tp = torch.where(masked_p, MASK, x)
    t = torch.tensor([0.97, 0.02, 0.5, 0.31, 0.66])
    t_p = (t + torch.tensor([0.0, 0.01, 0.1, 0.2, 0.05])).clamp(max=1.0)
    pair = StalePair(z_t=z_t, z_tprime=z_tp, t=t, t_prime=t_p, k=torch.zeros(B, dtype=torch.long),
                     K=torch.ones(B, dtype=torch.long), T=torch.ones(B, dtype=torch.long))
    return x, t, z_t, pair


def _rows_of(pair: StalePair, rows: slice) -> StalePair:
    return StalePair(**{f.name: getattr(pair, f.name)[rows] for f in dataclasses.fields(pair)})


def _capacity(pair: StalePair) -> int:
    """The readouts' gather size under `_pin_draws`: two rows more than the most masked draw
    (z_t' masks a superset of z_t), below B L, so the fast path gathers and pads."""
    return int(pair.z_tprime.eq(MASK).sum()) + 2


def _pin_draws(monkeypatch, t, z_t, pair):
    """Make the methods' noise draws the hand-made ones (so the reference sees the same), and
    their readouts' capacity `_capacity` (the bound of masked_rows_capacity is B L at these sizes)."""
    for unit in (methods.base, methods.tadm):
        monkeypatch.setattr(unit, "sample_times", lambda *a, **k: t)
    monkeypatch.setattr(methods.base, "mask_tokens", lambda *a, **k: z_t)
    monkeypatch.setattr(methods.tadm, "stale_pair", lambda *a, **k: pair)
    assert _capacity(pair) < B * L
    monkeypatch.setattr(methods.base, "masked_rows_capacity", lambda *a, **k: _capacity(pair))


def _setup(run: str, seed: int = 0):
    p = config.from_dict(micro_raw(**SMALL))
    method = get_method(run, p)
    torch.manual_seed(seed)
    model = method.build_model(V, L)
    frozen = {n for n, q in model.named_parameters() if not q.requires_grad}
    _randomize_(model, seed)
    for n, q in model.named_parameters():
        q.requires_grad_(n not in frozen)
    return method, model


# --------------------------------------------------------------------------- the reference


def _reference_loss(run: str, method, model, x, t, z_t, pair, train: bool = True):
    """Today's objectives before the fast path: the model's full logits into the full-logits
    definitions of tadm.losses (the code the methods ran before)."""
    S = method.schedule
    if run in ("mdlm",):
        return mdlm_nelbo(subs_log_probs(model(z_t), z_t, MASK), x, z_t, t, S, MASK)
    if run == "sedd":
        return sedd_score_entropy(model(z_t), x, z_t, t, S, MASK)
    if run == "adlm":
        logits, anchor_logits = model(z_t)
        nelbo = mdlm_nelbo(subs_log_probs(logits, z_t, MASK), x, z_t, t, S, MASK)
        return nelbo + GAMMA * adlm_anchor_loss(anchor_logits, x, z_t, t, S, MASK) if train else nelbo
    if not train:  # TADM's bound: a fresh anchor
        return mdlm_nelbo(subs_log_probs(model(z_t, z_t), z_t, MASK), x, z_t, t, S, MASK)
    if method.gamma > 0:
        logits, anchor_logits = model(pair.z_t, pair.z_tprime, return_anchor_logits=True)
    else:
        logits, anchor_logits = model(pair.z_t, pair.z_tprime), None
    return t_anelbo(subs_log_probs(logits, pair.z_t, MASK), anchor_logits, x, pair, S, MASK, method.gamma)[0]


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: (q.grad.clone() if q.grad is not None else None) for n, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


def _assert_grads_close(fast, ref):
    assert fast.keys() == ref.keys()
    for n in ref:
        if ref[n] is None:  # only the frozen anchor head of TADM-gamma0
            assert fast[n] is None, n
            continue
        scale = ref[n].abs().max().item()
        torch.testing.assert_close(fast[n], ref[n], rtol=1e-5, atol=1e-6 * max(scale, 1e-3), msg=n)


# --------------------------------------------------------------------------- values and gradients


# (logits per chunk, checkpoint threshold): one plain chunk / one checkpointed chunk /
# checkpointed 3-row chunks
SETTINGS = [(None, None), (None, 0), (3 * (V + 1), 0)]


def _patch_sizes(monkeypatch, chunk_elements, checkpoint_min):
    if chunk_elements is not None:
        monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk_elements)
    if checkpoint_min is not None:
        monkeypatch.setattr(losses, "CHECKPOINT_MIN_ELEMENTS", checkpoint_min)


@pytest.mark.parametrize("chunk_elements,checkpoint_min", SETTINGS, ids=["plain", "checkpointed", "chunked"])
@pytest.mark.parametrize("run", RUNS)
def test_training_loss_and_gradients_match_the_full_logits_reference(monkeypatch, run, chunk_elements,
                                                                       checkpoint_min):
    _patch_sizes(monkeypatch, chunk_elements, checkpoint_min)
    method, model = _setup(run)
    x, t, z_t, pair = _draws()
    _pin_draws(monkeypatch, t, z_t, pair)

    ref = _reference_loss(run, method, model, x, t, z_t, pair)
    ref.sum().backward()
    ref_grads = _grads(model)
    fast = method.loss(model, x, torch.Generator(), progress=1.0)
    fast.sum().backward()
    fast_grads = _grads(model)

    assert fast.shape == (B,) and fast.dtype == torch.float32
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    # row 1 has no masked position (TADM's anchor rows: 3; ADLM's anchor term covers its
    # important tokens masked or not, as released)
    assert fast[1] == 0 or run in ("tadm", "adlm")
    _assert_grads_close(fast_grads, ref_grads)
    if run == "tadm_gamma0":
        assert all(fast_grads[n] is None for n in fast_grads if n.startswith("anchor_head."))


@pytest.mark.parametrize("run", RUNS)
def test_validation_nelbo_matches_the_reference(monkeypatch, run):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 4 * (V + 1))
    method, model = _setup(run, seed=1)
    x, t, z_t, pair = _draws(seed=1)
    _pin_draws(monkeypatch, t, z_t, pair)
    with torch.no_grad():
        ref = _reference_loss(run, method, model, x, t, z_t, pair, train=False)
        fast = method.nelbo(model, x, torch.Generator())
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)


def test_no_masked_position_gives_zero_and_zero_gradients(monkeypatch):
    monkeypatch.setattr(losses, "CHECKPOINT_MIN_ELEMENTS", 0)  # an empty checkpointed chunk
    method, model = _setup("tadm")
    x, t, _, _ = _draws()
    pair = StalePair(z_t=x, z_tprime=x, t=t, t_prime=t, k=torch.zeros(B, dtype=torch.long),
                     K=torch.ones(B, dtype=torch.long), T=torch.ones(B, dtype=torch.long))
    _pin_draws(monkeypatch, t, x, pair)
    loss = method.loss(model, x, torch.Generator())
    loss.sum().backward()
    assert torch.equal(loss, torch.zeros(B))
    for head in (model.final, model.anchor_head):  # in the graph (what DDP needs), gradient 0
        assert all(q.grad is not None and not q.grad.any() for q in head.parameters())


# --------------------------------------------------------------------------- what the head sees


def _record_heads(model, run):
    heads = {"final": model.final}
    if run == "tadm":
        heads["anchor_head"] = model.anchor_head
    seen = {name: [] for name in heads}
    handles = [m.register_forward_hook(lambda mod, args, out, name=name: seen[name].append(tuple(out.shape)))
               for name, m in heads.items()]
    return seen, handles


@pytest.mark.parametrize("run", RUNS)
def test_training_runs_the_head_on_the_masked_rows_only(monkeypatch, run):
    _patch_sizes(monkeypatch, 7 * (V + 1), 0)  # checkpointed 7-row chunks
    method, model = _setup(run)
    x, t, z_t, pair = _draws()
    _pin_draws(monkeypatch, t, z_t, pair)
    seen, handles = _record_heads(model, run)
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = method.loss(model, x, torch.Generator())
    for h in handles:
        h.remove()

    rows = {"final": int((pair.z_t if run.startswith("tadm") else z_t).eq(MASK).sum()),
            "anchor_head": int(pair.z_tprime.eq(MASK).sum())}
    for name, shapes in seen.items():  # the masked rows and the padding up to the fixed capacity
        assert all(len(s) == 2 and s[0] <= 7 and s[1] == V + 1 for s in shapes), (name, shapes)
        assert rows[name] <= sum(s[0] for s in shapes) == _capacity(pair) < B * L
    # nothing vocabulary-wide is kept for backward (checkpointed chunks keep only their inputs),
    # except ADLM's anchor logits, which its denoiser reads at every position (raw, as released)
    wide = [s for s in saved if s and s[-1] in (V, V + 1)]
    if run == "adlm":
        assert (B * L, V + 1) in wide  # the model's own: the anchor logits feed denoiser_in
        own = {(B * L, V + 1), (32, V + 1)}  # denoiser_in's input (the logits) and its weight
        assert all(s in own or (len(s) == 2 and s[0] <= 7 and s[1] == V + 1) for s in wide), wide
    else:
        assert wide == [], wide
    loss.sum().backward()  # the recomputation works


def test_full_sequence_outputs_are_unchanged_for_sampling():
    """Without a readout every model still returns full logits, and the head on rows
    (N, d) equals the head on the full sequence at those rows."""
    for run in ("mdlm", "adlm", "tadm"):
        method, model = _setup(run)
        x, t, z_t, pair = _draws()
        with torch.no_grad():
            if run == "tadm":
                full = model(z_t, pair.z_tprime)
                h = model.hidden(z_t, pair.z_tprime)
            else:
                full = model(z_t)[0] if run == "adlm" else model(z_t)
                h = model.hidden(z_t)
            assert full.shape == (B, L, V + 1)
            rows = z_t == MASK
            torch.testing.assert_close(model.head(h[rows]), full[rows], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(model.head(h), full)


# --------------------------------------------------------------------------- pieces


def test_subs_readout_on_logits_matches_mdlm_nelbo_and_casts_to_fp32():
    x, t, z_t, _ = _draws(seed=4)
    logits = torch.randn(B, L, V + 1, generator=torch.Generator().manual_seed(2))
    S = LogLinearSchedule(1e-3)
    ref = mdlm_nelbo(subs_log_probs(logits, z_t, MASK), x, z_t, t, S, MASK)
    fast = losses.nelbo_from_rows(subs_readout(z_t, x, MASK)(logits), t, S)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    half = losses.nelbo_from_rows(subs_readout(z_t, x, MASK)(logits.bfloat16()), t, S)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, ref, rtol=2e-2, atol=1e-2)


def _reference_ar_nll(logits, x, dtype=torch.float32):
    """ar_nll before the chunked version: a shifted, cast and reshaped copy of the logits."""
    pred = logits[:, :-1].to(dtype)
    target = x[:, 1:]
    nll = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="none")
    return nll.view(target.shape).sum(-1)


@pytest.mark.parametrize("chunk_elements,checkpoint_min", [(None, None), (5 * V, 0)], ids=["plain", "chunked"])
def test_ar_nll_chunked_matches_the_reference(monkeypatch, chunk_elements, checkpoint_min):
    _patch_sizes(monkeypatch, chunk_elements, checkpoint_min)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(V, (B, L), generator=g)
    logits = torch.randn(B, L, V, generator=g, requires_grad=True)
    ref = _reference_ar_nll(logits, x)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    fast = ar_nll(logits, x)
    (g_fast,) = torch.autograd.grad(fast.sum(), logits)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_fast, g_ref, rtol=1e-5, atol=1e-7)
    assert not g_fast[:, -1].any()  # the last position predicts nothing
    assert ar_nll(logits.detach().bfloat16(), x).dtype == torch.float32


def test_checkpointing_starts_at_the_threshold_and_chunks_bound_the_logits(monkeypatch):
    calls = []
    real = losses._checkpoint
    monkeypatch.setattr(losses, "_checkpoint", lambda fn, *a, **k: calls.append(a[0].shape) or real(fn, *a, **k))
    cols = 1024
    n_min = losses.CHECKPOINT_MIN_ELEMENTS // cols
    y = torch.zeros(n_min, dtype=torch.long)
    ce = lambda logits, target: torch.nn.functional.cross_entropy(logits, target, reduction="none")
    small = torch.zeros(n_min - 1, cols, requires_grad=True)
    losses.row_losses(small, y[:-1], None, ce, cols)
    assert calls == []  # below the threshold: plain forward
    big = torch.zeros(n_min, cols, requires_grad=True)
    losses.row_losses(big, y, None, ce, cols)
    assert calls == [(n_min, cols)]  # one chunk of all rows (CHUNK_ELEMENTS > 2^20)
    with torch.no_grad():  # validation: never
        losses.row_losses(big, y, None, ce, cols)
    assert len(calls) == 1
    assert losses.chunk_rows(50258) == 667  # the paper vocabulary + mask: 667 rows per chunk


# --------------------------------------------------------------------------- DDP


_DDP_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path.insert(0, os.getcwd())
    from tests.test_losses_fast import _setup, _draws, _pin_draws, _rows_of
    import pytest

    def main(rank, world, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.set_num_threads(1)
        from tadm import losses
        losses.CHUNK_ELEMENTS, losses.CHECKPOINT_MIN_ELEMENTS = 3 * 24, 0  # checkpointed 3-row chunks
        method, model = _setup("tadm")
        x, t, z_t, pair = _draws()
        half = slice(rank * 2, rank * 2 + 3)  # overlapping halves: rows 0-2 and 2-4
        sub = _rows_of(pair, half)
        mp = pytest.MonkeyPatch()
        _pin_draws(mp, t[half], z_t[half], sub)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for _ in range(2):  # twice: the reducer must finish every iteration
            model.zero_grad(set_to_none=True)
            method.loss(ddp, x[half], torch.Generator()).sum().backward()
        if rank == 0:
            from safetensors.torch import save_file
            save_file({n: q.grad.contiguous() for n, q in model.named_parameters()}, out)
        dist.destroy_process_group()

    if __name__ == "__main__":
        import socket
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        torch.multiprocessing.spawn(main, args=(2, sys.argv[1], port), nprocs=2)
""")


@pytest.mark.slow  # two spawned processes: ~15 s on 2 cores
def test_ddp_step_through_the_readout_equals_one_process(tmp_path, monkeypatch):
    """Two gloo processes, each on 3 of the 5 rows, average to one process's gradient of the
    mean of the two losses: the readout runs inside DDP's forward, checkpointed chunks included."""
    script = tmp_path / "ddp.py"
    script.write_text(_DDP_SCRIPT)
    out = tmp_path / "grads.safetensors"
    res = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=120,
                         cwd=str(config.ROOT))
    assert res.returncode == 0, res.stderr[-3000:]
    from safetensors.torch import load_file

    got = load_file(str(out))

    _patch_sizes(monkeypatch, 3 * (V + 1), 0)
    method, model = _setup("tadm")
    x, t, z_t, pair = _draws()
    total = 0
    for rank in range(2):
        half = slice(rank * 2, rank * 2 + 3)
        sub = _rows_of(pair, half)
        _pin_draws(monkeypatch, t[half], z_t[half], sub)
        total = total + method.loss(model, x[half], torch.Generator()).sum() / 2
    total.backward()
    _assert_grads_close(got, _grads(model))


@pytest.mark.parametrize("run", RUNS)
def test_kept_heads_run_each_head_once_with_the_checkpointed_values_and_gradients(monkeypatch, run):
    """checkpoint_heads False (the trainer's choice when the logits fit): the head forward runs
    once per chunk, backward recomputes nothing, and loss and gradients are bit for bit those
    of the checkpointed readout."""
    _patch_sizes(monkeypatch, 7 * (V + 1), 0)  # 7-row chunks, checkpointed whenever asked
    x, t, z_t, pair = _draws()
    _pin_draws(monkeypatch, t, z_t, pair)
    results = {}
    for keep in (False, True):
        method, model = _setup(run)
        method.checkpoint_heads = not keep
        seen, handles = _record_heads(model, run)
        loss = method.loss(model, x, torch.Generator())
        forwards = sum(len(s) for s in seen.values())
        loss.sum().backward()
        for h in handles:
            h.remove()
        results[keep] = loss.detach(), _grads(model), forwards, sum(len(s) for s in seen.values())
    (loss_c, grads_c, fwd_c, total_c), (loss_k, grads_k, fwd_k, total_k) = results[False], results[True]
    assert torch.equal(loss_k, loss_c)
    for n in grads_c:
        assert (grads_c[n] is None and grads_k[n] is None) or torch.equal(grads_k[n], grads_c[n]), n
    assert fwd_k == fwd_c and total_k == fwd_k  # kept: backward runs no head forward
    assert total_c > fwd_c  # checkpointed: backward recomputes the chunks' heads
