"""Post-train training: one real step on the tiny DiffusionGemma, the paper path on local files,
checkpoint resume of the loop (and its refusal of other settings), the global batch's split
across processes, saving and loading the fusion."""

import copy
import json

import pytest
import torch

from tests.posttrain.conftest import CANVAS, VOCAB, tiny_config

from tadm.config import Params, override
from tadm.errors import ConfigError, DataError
from tadm.posttrain import model as dgm
from tadm.posttrain.anchored import sampling_kwargs
from tadm.posttrain.data import CanvasBatch
from tadm.posttrain.objective import Rollout, antithetic_times, base_loss, decoder_logits, posttrain_loss, uniform_noise
from tadm.posttrain.train import _loop, _settings, cosine_lr, micro_batches
from tadm.runtime import Dist
from tadm.train import checkpoint as ck
from tadm.train.trainer import GlobalBatches


def params(**kw) -> Params:
    base = {"posttrain.shared_layers": 1, "posttrain.anchor_layers": 3, "posttrain.denoiser_layers": 2,
            "posttrain.fusion_rank": 16, "posttrain.canvas_length": CANVAS, "posttrain.sample_steps": 6}
    return override(Params(), {**base, **kw})


def batch(b=3, n_ctx=5, seed=0) -> CanvasBatch:
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(3, VOCAB, (b, n_ctx), generator=g)
    mask = torch.ones_like(ctx, dtype=torch.bool)
    mask[0, :2] = False  # a left-padded context
    return CanvasBatch(ctx, mask, torch.randint(3, VOCAB, (b, CANVAS), generator=g), torch.rand(b, generator=g))


def step(tadm, p, b, seed=0):
    rollout = Rollout(p.posttrain.sample_steps, 0.1, (0.8, 0.4), CANVAS, VOCAB)
    opt = torch.optim.AdamW(tadm.fusion.parameters(), lr=1e-2)
    loss, logs = posttrain_loss(tadm.split, tadm.fusion, b, torch.Generator().manual_seed(seed), p.posttrain, rollout)
    loss.backward()
    grads = {n: q.grad.clone() for n, q in tadm.fusion.named_parameters()}
    opt.step()
    return loss, logs, grads


def test_one_step_trains_only_the_fusion(tiny_base):
    p = params(**{"posttrain.cache_age_probs": [0.0, 0.0, 1.0]})  # always a 2-step-old anchor
    tadm = dgm.build_tadm(tiny_base, p)
    before_base = copy.deepcopy(tiny_base.state_dict())
    before_fusion = copy.deepcopy(tadm.fusion.state_dict())
    loss, logs, grads = step(tadm, p, batch())
    assert torch.isfinite(loss) and logs["age"] == 2 and logs["kd"] >= 0
    assert grads["up.weight"].abs().sum() > 0  # the zero-initialised projection gets a gradient
    assert any(not torch.equal(before_fusion[k], v) for k, v in tadm.fusion.state_dict().items())
    assert all(torch.equal(before_base[k], v) for k, v in tiny_base.state_dict().items())


def test_a_fresh_anchor_gives_the_fusion_no_gradient(tiny_base):
    """k = 0: the current shallow state is C0, so the fused state is H0 whatever the weights."""
    p = params(**{"posttrain.cache_age_probs": [1.0, 0.0, 0.0]})
    tadm = dgm.build_tadm(tiny_base, p)
    _, logs, grads = step(tadm, p, batch())
    assert logs["age"] == 0 and logs["kd"] == pytest.approx(0.0, abs=1e-6)
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


def test_noise_and_times():
    g = torch.Generator().manual_seed(0)
    t = antithetic_times(1000, g)
    assert t.min() > 0 and t.max() < 1 and abs(float(t.mean()) - 0.5) < 1e-3
    x = torch.zeros(2, 20000, dtype=torch.long)
    z = uniform_noise(x, torch.tensor([0.0, 0.5]), 100, g)
    assert torch.equal(z[0], x[0])
    # a replaced token is uniform over 100 ids, so it is 0 again with probability 1/100
    assert abs(float((z[1] != 0).float().mean()) - 0.5 * 0.99) < 0.02


def test_the_base_loss_encodes_the_context_once_with_the_same_values_and_gradients():
    """base_loss reads one encoder cache in both decoder passes; encoding the context for each
    pass (the plain model call) gives the same loss and the same gradient of every parameter
    (the encoder's reach it through the trained pass's reads of the cache)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(tiny_config()).train()
    b = batch(b=4)

    def per_pass(model, b, gen, p):  # the reference: the context encoded by each model call
        t = antithetic_times(len(b.target), gen)
        z = uniform_noise(b.target, t, model.config.text_config.vocab_size, gen)
        use_sc = torch.rand(len(z), generator=gen) < p
        with torch.no_grad():
            sc = decoder_logits(model, b, z)
        logits = decoder_logits(model, b, z, sc, use_sc)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), b.target.flatten())

    grads, encoded = [], []
    hook = model.model.encoder.register_forward_hook(lambda *_: encoded.append(1))
    for fn in (base_loss, per_pass):
        model.zero_grad()
        encoded.clear()
        loss = fn(model, b, torch.Generator().manual_seed(3), 0.5)
        loss.backward()
        grads.append((loss.detach(), {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None},
                      len(encoded)))
    hook.remove()
    (loss, g, n_enc), (ref, g_ref, n_ref) = grads
    assert (n_enc, n_ref) == (1, 2)
    assert torch.allclose(loss, ref, rtol=1e-6, atol=1e-6) and g.keys() == g_ref.keys()
    assert any("encoder" in n and v.abs().sum() > 0 for n, v in g.items())  # the encoder is trained
    assert all(torch.allclose(g[n], g_ref[n], rtol=1e-5, atol=1e-7) for n in g)


def test_paper_profile_path_on_a_local_checkpoint(tmp_path, tiny_base):
    """from_pretrained(dir) in bf16 -> split -> fusion -> one training step -> generation with K = 2."""
    tiny_base.save_pretrained(tmp_path / "dg")
    p = params(**{"posttrain.base_model": str(tmp_path / "dg"), "posttrain.precision": "bf16",
                  "posttrain.cache_age_probs": [0.0, 1.0, 0.0]})
    base = dgm.load_base(dgm.base_source(p), p.posttrain.precision)
    assert base.dtype == torch.bfloat16 and not any(q.requires_grad for q in base.parameters())
    tadm = dgm.build_tadm(base, p)
    tadm.fusion.float()
    loss, _, grads = step(tadm, p, batch())
    assert torch.isfinite(loss) and grads["up.weight"].abs().sum() > 0
    tadm.fusion.to(torch.bfloat16)
    torch.manual_seed(0)
    out = tadm.generate(batch().context, refresh_every=2, **sampling_kwargs(6, 0.1, (0.8, 0.4), CANVAS, None, None))
    assert out.sequences.shape == (3, 5 + CANVAS)
    assert tadm.counters.refreshes == 3 and tadm.counters.steps == 6


def test_load_base_names_a_missing_checkpoint(tmp_path):
    with pytest.raises(DataError, match="config.json missing"):
        dgm.load_base(str(tmp_path / "nothing_here"))


def test_fusion_round_trip_and_mismatch(tmp_path, tiny_base):
    p = params()
    tadm = dgm.build_tadm(tiny_base, p)
    with torch.no_grad():
        for q in tadm.fusion.parameters():
            q.normal_()
    dgm.save_fusion(tadm, tmp_path, "tiny")
    fresh = dgm.build_tadm(tiny_base, p)
    record = dgm.load_fusion(fresh, tmp_path)
    assert record["split"] == [1, 3, 2] and record["parameters"] == tadm.fusion.num_parameters
    assert all(torch.equal(a, b) for a, b in zip(tadm.fusion.state_dict().values(), fresh.fusion.state_dict().values()))
    other = dgm.build_tadm(tiny_base, params(**{"posttrain.fusion_rank": 8}))
    with pytest.raises(ConfigError, match="rank=16"):
        dgm.load_fusion(other, tmp_path)


def test_cosine_schedule():
    assert cosine_lr(0, 1.0, 10, 100, 0.1) == pytest.approx(0.1)
    assert cosine_lr(9, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert cosine_lr(10, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert cosine_lr(100, 1.0, 10, 100, 0.1) == pytest.approx(0.1)


def _run(run_dir, steps, settings=None, restart=False, micro=2):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    data = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))

    def loss_fn(module, idx, gen):
        x = data[idx] + 0.1 * torch.randn(len(idx), 4, generator=gen)
        loss = module(x).pow(2).mean()
        return loss, {"x_mean": x.mean(), "n": len(idx)}  # a logged tensor is read at log time

    history = _loop("toy", net, loss_fn, steps=steps, batch=4, micro=micro, n_data=32, lr_at=lambda s: 0.1, opt=opt,
                    clip=1.0, run_dir=run_dir, settings=settings or {"lr": 0.1}, seed=0, log_every=1,
                    checkpoint_every=2, d=Dist(), log=lambda *_: None, restart=restart)
    assert all(isinstance(r["x_mean"], float) and r["n"] == 4 for r in history)
    return net


def test_loop_resumes_to_the_same_weights(tmp_path):
    straight = _run(tmp_path / "a", 6)
    _run(tmp_path / "b", 4)  # "killed" after step 4 (checkpoints at 2 and 4)
    resumed = _run(tmp_path / "b", 6)
    assert torch.equal(straight.weight, resumed.weight) and torch.equal(straight.bias, resumed.bias)


def test_loop_refuses_other_settings_and_restart_moves_them_aside(tmp_path):
    _run(tmp_path / "run", 4, {"posttrain": {"lr": 0.1}})
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(ck.SettingsChanged, match=r"posttrain\.lr \(0\.1 -> 0\.2\).*python -m tadm toy --restart"):
        _run(tmp_path / "run", 4, {"posttrain": {"lr": 0.2}})
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    _run(tmp_path / "run", 2, {"posttrain": {"lr": 0.2}}, restart=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run.old-4").rglob("*") if p.is_file()} == before
    assert (tmp_path / "run" / "latest").read_text().strip() == "step_000002"


def test_loop_holds_its_run_directory_and_lets_go_after_an_error(tmp_path):
    """The post-train and ASRD loop takes the same run lock as the trainer."""
    _run(tmp_path / "run", 2)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with ck.RunLock(tmp_path / "run", "the first run"):
        with pytest.raises(ck.RunLocked, match=r"in use by pid \d+ .*the first run.*run\.lock"):
            _run(tmp_path / "run", 4)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    with pytest.raises(ck.SettingsChanged):
        _run(tmp_path / "run", 4, {"lr": 0.2})
    _run(tmp_path / "run", 4)  # the refused run let go of the lock
    assert (tmp_path / "run" / "latest").read_text().strip() == "step_000004"


@pytest.mark.parametrize("world, accum", [(2, 2), (4, 1)])
def test_a_global_batch_is_the_same_examples_and_draws_for_any_number_of_processes(world, accum):
    """N processes x grad_accum G split what 1 process does with grad_accum N x G: the same
    global micro-batches j (hence the same generator seeds) over the same examples."""
    batch, step = 3, 5
    one = micro_batches(GlobalBatches(50, batch * accum * world, 0).indices(step), batch, accum * world, Dist())
    indices = GlobalBatches(50, batch * accum * world, 0).indices(step)
    split = [mb for rank in range(world) for mb in micro_batches(indices, batch, accum, Dist(rank, world))]
    assert len(split) == world * accum and all(len(ex) == batch for _, ex in split)
    assert sorted(split) == sorted(one)


def test_what_each_post_train_run_fingerprints(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {}}))
    p = params()
    fusion, base = _settings("dg_posttrain", p, tmp_path, {}), _settings("dg_base", p, tmp_path, {})
    # Table 1's evaluation and the log / checkpoint cadence belong to neither run
    q = params(**{"posttrain.tasks": ["gsm8k"], "posttrain.seeds": [5], "posttrain.log_every": 7,
                  "posttrain.checkpoint_every": 9, "posttrain.eval_batch_size": 3, "runtime.nproc": 4})
    assert _settings("dg_posttrain", q, tmp_path, {}) == fusion and _settings("dg_base", q, tmp_path, {}) == base
    # the fusion's optimiser is not the base's run; the steps stay (the cosine ends at them)
    q = params(**{"posttrain.lr": 1e-3, "posttrain.grad_accum": 2})
    assert _settings("dg_base", q, tmp_path, {}) == base and _settings("dg_posttrain", q, tmp_path, {}) != fusion
    assert _settings("dg_posttrain", params(**{"posttrain.steps": 7}), tmp_path, {}) != fusion
    q = override(p, {"posttrain.base.steps": 7})
    assert _settings("dg_base", q, tmp_path, {}) != base and _settings("dg_posttrain", q, tmp_path, {}) == fusion
