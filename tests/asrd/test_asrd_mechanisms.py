"""ASRD's three mechanisms on hand-made states: the anchor tokens cache, the anchor-guided
signal, and the orthogonal-perturbation verification."""

import math

import pytest
import torch

from tadm.asrd.atc import AnchorTokensCache
from tadm.asrd.decode import DecodeSettings, _Run
from tadm.asrd.guidance import anchor_centroid, guidance_signal
from tadm.asrd.verify import orthogonal_perturbation, survivors
from tests.asrd.conftest import TableBackend

ALL = torch.ones(1, 4, dtype=torch.bool)


def _cache(window=2, capacity=16, shape=(1, 4)):
    atc = AnchorTokensCache(capacity, window)
    atc.start(shape)
    return atc


# ----------------------------------------------------------------------------- the cache


def test_a_token_enters_only_after_k_consistent_passes_and_leaves_when_it_changes():
    atc = _cache(window=2)
    tokens = torch.tensor([[5, 6, 7, 8]])
    decided = torch.tensor([[True, True, True, False]])
    ent = torch.zeros(1, 4)
    atc.observe(tokens, ent, ALL)  # pass 1: every prediction is its token, once
    assert not atc.select(tokens, decided, ALL).any()  # one pass is not k = 2
    atc.observe(tokens, ent, ALL)  # pass 2: held
    assert atc.select(tokens, decided, ALL).tolist() == [[True, True, True, False]]  # undecided 8 is no anchor
    pred = torch.tensor([[5, 9, 7, 8]])  # position 1's prediction changes
    atc.observe(pred, ent, ALL)
    assert atc.select(tokens, decided, ALL).tolist() == [[True, False, True, False]]
    atc.observe(tokens, ent, ALL)  # back to its token: a new streak of 1 < k
    assert atc.select(tokens, decided, ALL).tolist() == [[True, False, True, False]]
    atc.observe(tokens, ent, ALL)
    assert atc.select(tokens, decided, ALL).tolist() == [[True, True, True, False]]


@pytest.mark.parametrize("k", [1, 3])
def test_the_window_is_k(k):
    atc, tokens = _cache(window=k), torch.tensor([[1, 2, 3, 4]])
    for n in range(1, k + 2):
        atc.observe(tokens, torch.zeros(1, 4), ALL)
        assert bool(atc.select(tokens, ALL, ALL).all()) == (n >= k)


def test_capacity_keeps_the_lowest_entropy_anchors_and_a_remask_leaves():
    atc, tokens = _cache(window=1, capacity=2), torch.tensor([[1, 2, 3, 4]])
    atc.observe(tokens, torch.tensor([[0.5, 0.1, 0.9, 0.2]]), ALL)
    assert atc.select(tokens, ALL, ALL).tolist() == [[False, True, False, True]]
    assert atc.size.tolist() == [2]
    atc.forget(torch.tensor([[False, True, False, False]]))  # position 1 remasked
    decided = torch.tensor([[True, False, True, True]])
    assert atc.select(tokens, decided, ALL).tolist() == [[True, False, False, True]]  # the next-best takes its place


def test_unobserved_positions_keep_their_streak():
    """Absorbing-state models: a visible token is not re-predicted, its streak is frozen."""
    atc, tokens = _cache(window=2), torch.tensor([[1, 2, 3, 4]])
    atc.observe(tokens, torch.zeros(1, 4), ALL)
    atc.observe(torch.tensor([[7, 7, 7, 7]]), torch.zeros(1, 4), torch.tensor([[False, False, True, True]]))
    assert atc.streak.tolist() == [[1, 1, 1, 1]] and atc.last_pred.tolist() == [[1, 2, 7, 7]]


# ----------------------------------------------------------------------------- guidance


def test_the_injected_signal_is_zero_when_the_cache_is_empty():
    e = torch.randn(2, 4, 3)
    none = torch.zeros(2, 4, dtype=torch.bool)
    g = anchor_centroid(e, none, torch.rand(2, 4))
    assert torch.count_nonzero(g) == 0
    signal = guidance_signal(g, torch.ones(2, 4, dtype=torch.bool), torch.full((2, 4), float("inf")), 5.0, 10)
    assert torch.count_nonzero(signal) == 0


def test_the_centroid_is_the_entropy_weighted_mean_of_the_anchors():
    e = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])
    member = torch.tensor([[True, True, False]])
    ent = torch.tensor([[0.0, math.log(3.0), 0.0]])  # weights e^0 : e^-log3 = 3 : 1
    assert torch.allclose(anchor_centroid(e, member, ent), torch.tensor([[0.75, 0.25]]))


def test_the_signal_goes_to_masked_positions_only_scaled_by_their_entropy():
    g = torch.tensor([[2.0, -1.0]])
    targets = torch.tensor([[True, False, True]])
    ent = torch.tensor([[math.log(10) / 2, 0.0, float("inf")]])  # half the maximum, decided, never predicted
    s = guidance_signal(g, targets, ent, 0.5, vocab_size=10)
    assert torch.allclose(s[0, 0], 0.5 * 0.5 * g[0]) and torch.count_nonzero(s[0, 1]) == 0
    assert torch.allclose(s[0, 2], 0.5 * g[0])


# ----------------------------------------------------------------------------- verification


@pytest.mark.parametrize("scale", [0.0, 0.3, 2.0])
def test_the_perturbation_is_orthogonal_to_the_token_embedding_with_the_asked_norm(scale):
    e = torch.randn(64, 16, dtype=torch.float64) * torch.rand(64, 1, dtype=torch.float64) * 5
    d = orthogonal_perturbation(e, scale, torch.Generator().manual_seed(0))
    cos = (d * e).sum(-1) / (e.norm(dim=-1) * d.norm(dim=-1).clamp_min(1e-300))
    assert cos.abs().max() < 1e-12
    assert torch.allclose(d.norm(dim=-1), scale * e.norm(dim=-1), rtol=1e-12, atol=1e-12)
    again = orthogonal_perturbation(e, scale, torch.Generator().manual_seed(0))
    assert torch.equal(d, again)  # the draw is the generator's


def test_survivors_keep_their_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    assert survivors(logits, torch.tensor([1, 2])).tolist() == [True, False]


# Two-dimensional embeddings: e0 = (1, 0), e1 = (0.8, 0.6), e2 = (0.8, -0.6). The directions
# orthogonal to e0 are +-(0, 1); a push of size rho gives token 1 or 2 a score 0.8 + 0.6 rho
# against token 0's 1: the candidate flips exactly when rho > 1/3, whichever the sign.
TABLE = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6], [0.0, 0.0]])


def _run(backend, canvas, decided, **settings):
    cfg = DecodeSettings(method="asrd", **{"steps": 4, **settings})
    run = _Run(backend, torch.tensor(canvas), torch.ones(len(canvas[0]), dtype=torch.bool), cfg, torch.Generator().manual_seed(0))
    run.decided = torch.tensor(decided)
    return run


@pytest.mark.parametrize("rho, flips", [(0.2, False), (0.3, False), (0.4, True), (1.0, True)])
def test_a_candidate_that_flips_under_the_perturbation_is_remasked_one_that_holds_is_kept(rho, flips):
    backend = TableBackend(TABLE, mask_id=3)
    # two decided candidates (token 0), two masked positions
    run = _run(backend, [[0, 0, 3, 3]], [[True, True, False, False]], perturbation=rho)
    run.conf_at = torch.tensor([[0.5, 0.99, 0.0, 0.0]])  # both below verify_below 1.0
    run.atc.member = torch.tensor([[False, True, False, False]])  # position 1 is a trusted anchor: never verified
    committed, flipped = run.confidence_step(torch.ones(1, 4, dtype=torch.bool), steps_left=4)
    assert flipped.tolist() == [[flips, False, False, False]]
    assert not committed[0, :2].any() and int(committed.sum()) == 1  # a remasked token is not re-decided in its own pass
    assert run.decided[0, :2].tolist() == [not flips, True]
    assert len(backend.inputs) == 1  # the check was part of the step's one (generation) pass
    ids, delta = backend.inputs[-1]
    assert ids.tolist() == [[0, 0, 3, 3]]  # uniform-state reading: the token stays
    assert torch.count_nonzero(delta[0, 1:]) == 0 and abs(float(delta[0, 0] @ TABLE[0].double())) < 1e-12
    assert math.isclose(float(delta[0, 0].norm()), rho, rel_tol=1e-12)


@pytest.mark.parametrize("rho, forced, revoked", [(0.01, 2, True), (1.0, 0, False)])
def test_the_verification_decision_is_read_from_that_pass_output(rho, forced, revoked):
    """Whatever the perturbation would do, the check reads the generation pass's own logits:
    forcing that pass's argmax at the candidate decides it (and no other pass is made)."""
    backend = TableBackend(TABLE, mask_id=3)
    inner = backend.logits

    def logits(ids, delta=None):
        out = inner(ids, delta).clone()
        out[0, 0] = -10.0
        out[0, 0, forced] = 10.0
        return out

    backend.logits = logits
    run = _run(backend, [[0, 3]], [[True, False]], perturbation=rho)
    _, flipped = run.confidence_step(torch.ones(1, 2, dtype=torch.bool), steps_left=2)
    assert flipped.tolist() == [[revoked, False]] and backend.counters.calls == 1
    assert run.atc.last_pred[0, 0] == (-1 if revoked else forced)  # the cache saw that reading (a remask forgets)


def test_no_check_at_a_block_last_step():
    backend = TableBackend(TABLE, mask_id=3)
    run = _run(backend, [[0, 3]], [[True, False]], perturbation=1.0)
    committed, flipped = run.confidence_step(torch.ones(1, 2, dtype=torch.bool), steps_left=1)
    assert not flipped.any() and committed.tolist() == [[False, True]]
    assert backend.inputs[-1][1] is None  # nothing perturbed


def test_absorbing_models_read_a_candidate_as_the_mask_pushed_orthogonally_to_its_token():
    backend = TableBackend(TABLE, mask_id=3)
    backend.reads_decided = False
    run = _run(backend, [[1, 3]], [[True, False]], steps=2, perturbation=0.5)
    run.confidence_step(torch.ones(1, 2, dtype=torch.bool), steps_left=2)
    ids, delta = backend.inputs[-1]
    assert ids.tolist() == [[3, 3]]  # the candidate is fed as the mask, in the generation pass
    assert abs(float(delta[0, 0] @ TABLE[1].double())) < 1e-12 and math.isclose(float(delta[0, 0].norm()), 0.5, rel_tol=1e-6)
    assert torch.count_nonzero(delta[0, 1]) == 0


def test_zero_perturbation_makes_no_verification_pass(tiny_models):
    from tadm.asrd.backends import MaskedBackend
    from tadm.asrd.decode import decode

    backend = MaskedBackend(tiny_models["mdlm"])
    region = torch.zeros(12, dtype=torch.bool)
    region[4:] = True
    r = decode(backend, torch.zeros(3, 12, dtype=torch.long), region,
               DecodeSettings(method="asrd", steps=8, block_size=4, guidance=1.0, perturbation=0.0))
    assert r.counters.calls == r.steps and r.remasked == 0


def test_a_survivor_gains_a_consistent_pass_and_after_k_is_an_anchor_no_longer_verified():
    backend = TableBackend(TABLE, mask_id=3)
    run = _run(backend, [[0, 0]], [[True, True]], perturbation=0.2, window=2)
    every = torch.ones(1, 2, dtype=torch.bool)
    for n in (1, 2):
        assert not run.confidence_step(every, steps_left=4)[1].any()  # holds
        assert run.atc.streak[0, 0] == n and backend.inputs[-1][1] is not None
    assert run.atc.member.tolist() == [[True, True]]
    run.confidence_step(every, steps_left=4)
    assert backend.inputs[-1][1] is None  # anchors are not verified: nothing is perturbed
    assert run.verified == 4
