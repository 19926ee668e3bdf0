"""Each method's objective against its definition on hand-built draws."""

import torch

from tadm import config
from tadm.forward_process import sample_times, stale_pair
from tadm.losses import anchor_cross_entropy, mdlm_nelbo, subs_log_probs
from tadm.methods import EPS, get_method
from tests.conftest import micro_raw

V, L, B = 40, 16, 4


def _setup(**overrides):
    p = config.from_dict(micro_raw(**overrides))
    torch.manual_seed(0)
    method = get_method("tadm", p)
    model = method.build_model(V, L)
    for prm in model.parameters():  # leave the zero init: make every path carry signal
        torch.nn.init.normal_(prm, std=0.1)
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(1))
    return p, method, model, x


def test_with_K_1_the_tadm_objective_is_training_with_a_fresh_anchor():
    p, method, model, x = _setup(**{"train.refresh_choices": [1], "train.gamma": 0.5})
    loss = method.loss(model, x, torch.Generator().manual_seed(7))

    # the same draws, by hand: K = 1 forces k = 0, so t' = t and z_t' = z_t
    g = torch.Generator().manual_seed(7)
    t = sample_times(B, EPS, True, g, x.device)
    pair = stale_pair(x, t, method.schedule, V, [1], p.train.budget_choices, g)
    assert torch.equal(pair.z_tprime, pair.z_t) and torch.equal(pair.t_prime, pair.t)
    fresh_h = model.anchor(pair.z_t)
    logits = model.denoise(pair.z_t, fresh_h)
    expected = (mdlm_nelbo(subs_log_probs(logits, pair.z_t, V), x, pair.z_t, t, method.schedule, V)
                + 0.5 * anchor_cross_entropy(model.anchor_logits(fresh_h), x, pair.z_t, t, method.schedule, V))
    torch.testing.assert_close(loss, expected)


def test_stale_training_uses_an_older_anchor():
    p, method, model, x = _setup(**{"train.refresh_choices": [8], "train.budget_choices": [4]})
    g = torch.Generator().manual_seed(3)
    t = sample_times(B, EPS, True, g, x.device)
    pair = stale_pair(x, t, method.schedule, V, [8], [4], g)
    assert (pair.t_prime >= pair.t).all() and (pair.t_prime > pair.t).any()
    assert ((pair.z_t == V) <= (pair.z_tprime == V)).all()  # z_t' is at least as masked


def test_gamma0_freezes_the_anchor_head_and_gamma_trains_it():
    p = config.from_dict(micro_raw())
    frozen = get_method("tadm_gamma0", p).build_model(V, L)
    assert not any(q.requires_grad for q in frozen.anchor_head.parameters())
    trained = get_method("tadm", p).build_model(V, L)
    assert all(q.requires_grad for q in trained.anchor_head.parameters())
