"""dKV-Cache-Decode on LLaDA (tadm.caches.llada.dkv) against a small reference of the release's
loop (tests/caches/release_refs.py: ref_dkv_decode, written from horseee/dKV-Cache @49a76fc) on a
random multi-head LLaDA in float32: the same tokens, the same passes and the same rows computed
per pass, at batch 1 and on a left-padded batch of 3; R = 1 is the base; the counts are the
closed form; the catalog's rows."""

import pytest
import torch

from tadm.asrd.backends import LladaBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.caches.catalog import CacheSpec
from tadm.caches.llada.dkv import LladaDkvBackend, cached_rows
from tadm.models import llada
from tests.caches.release_refs import ref_dkv_decode
from tests.caches.test_caches_llada import tiny_model

P, G, BLOCK = 6, 16, 8  # prompt columns (rows 1 and 2 of the batch left-padded), generated, semi-AR block
N = P + G
PADS = (0, 2, 3)  # left pads of the batch's rows
LAYERS = 4


def tiny_mha(seed: int = 0) -> llada.LladaModel:
    """The suite's random LLaDA with 2 heads of their own K/V (the release needs MHA)."""
    return tiny_model(seed, kv_heads=None)


@pytest.fixture(scope="module")
def model():
    return tiny_mha()


def prompts(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompts (batch, P), padding (batch, N) bool): row r left-padded by PADS[r] (pad id 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 40, (batch, P), generator=g)
    pad = torch.ones(batch, N, dtype=torch.bool)
    for r in range(batch):
        ids[r, : PADS[r]], pad[r, : PADS[r]] = 1, False
    return ids, pad


class Recording(LladaDkvBackend):
    """Records the rows each pass computes (weighted layer calls / L * N)."""

    def start(self):
        super().start()
        self.rows: list[int] = []

    def _count_layers(self, calls, weighted=None):
        super()._count_layers(calls, weighted)
        self.rows.append(round(weighted / calls * N))


class Unmasked(Recording):
    """The release exactly: no key mask, pads attended."""

    def key_mask(self, shape, device):
        return None


def run(backend, model, batch: int, steps: int = G, seed: int = 0, padding: bool = True):
    ids, pad = prompts(batch, seed)
    canvas = torch.cat([ids, torch.full((batch, G), model.mask_id)], dim=1)
    backend.set_padding(pad if padding else None)
    return decode(backend, canvas, torch.arange(N) >= P, DecodeSettings(method="low-confidence", steps=steps,
                                                                           block_size=BLOCK))


CASES = [(1, 2, G), (1, 8, G), (1, 3, G // 2), (3, 2, G), (3, 8, G), (3, 3, G // 2)]


@pytest.mark.parametrize("batch, reload, steps", CASES, ids=[f"b{b}-R{r}-steps{s}" for b, r, s in CASES])
def test_dkv_decode_matches_release(model, batch, reload, steps):
    """The release's loop (no key mask) against the backend with the key mask off: the same
    tokens, the same number of passes and the same rows computed at each pass. At batch 1 (no
    pads) the backend's own key mask is no mask, so it is the release as it runs."""
    for seed in range(3):
        ids, _ = prompts(batch, seed)
        ref, ref_rows = ref_dkv_decode(model, ids, steps, G, BLOCK, reload)
        backend = Unmasked(model, reload) if batch > 1 else Recording(model, reload)
        r = run(backend, model, batch, steps, seed)
        assert torch.equal(r.tokens, ref), (seed, r.tokens[:, P:], ref[:, P:])
        assert r.counters.calls == len(ref_rows) == steps
        assert backend.rows == ref_rows
        assert r.counters.refreshes == sum(n == N for n in ref_rows) and min(ref_rows) < N


@pytest.mark.parametrize("reload", [2, 8])
def test_dkv_decode_with_the_padding_mask_matches_the_release_given_the_mask(model, reload):
    """The backend as it runs here (the batch's key mask on every pass) against the release's loop
    given the same key mask: the same tokens and rows."""
    for seed in range(3):
        ids, pad = prompts(3, seed)
        ref, ref_rows = ref_dkv_decode(model, ids, G, G, BLOCK, reload, pad=pad)
        backend = Recording(model, reload)
        r = run(backend, model, 3, G, seed)
        assert torch.equal(r.tokens, ref) and backend.rows == ref_rows


def test_padding_mask_effect_on_the_release(model):
    """The deviation (docs/deviations.md): the release attends to pads. Over 8 left-padded batches
    of 3 at R = 2 and R = 8, the share of generated tokens of the padded rows that differ between
    the release (pads attended) and the masked decode; the unpadded row never differs."""
    differ = total = 0
    for reload in (2, 8):
        for seed in range(8):
            masked = run(Recording(model, reload), model, 3, G, seed).tokens[:, P:]
            release = run(Unmasked(model, reload), model, 3, G, seed).tokens[:, P:]
            assert torch.equal(masked[0], release[0])
            differ += int((masked[1:] != release[1:]).sum())
            total += masked[1:].numel()
    assert 0 < differ / total < 1  # the measured share is in docs/deviations.md


@pytest.mark.parametrize("batch", [1, 3])
def test_dkv_at_reload_1_is_the_base(model, batch):
    base = run(LladaBackend(model), model, batch)
    r = run(LladaDkvBackend(model, 1), model, batch)
    assert torch.equal(r.tokens, base.tokens)
    c = r.counters
    assert c.calls == base.counters.calls == c.refreshes and c.layer_calls_weighted == LAYERS * c.calls


@torch.no_grad()
def test_dkv_delays_caching_by_one_pass(model):
    """A token decided by pass i enters the input of pass i + 1, where its K/V are computed again;
    from pass i + 2 they are kept. At batch 1, R = 8: pass 2 computes the rows masked in pass 1's
    input (those decided at pass 0 are kept), pass 3 those masked in pass 2's input."""
    backend = Recording(model, 8)
    seen: list[torch.Tensor] = []
    run_ids: list[torch.Tensor] = []
    orig = backend.logits

    def logits(ids, delta=None):
        run_ids.append(ids.clone())
        if backend._kept is not None and not backend._full_due():
            seen.append(cached_rows(~backend._kept)[0].clone())
        return orig(ids, delta)

    backend.logits = logits
    run(backend, model, 1)
    first_block = [i for i in run_ids[:BLOCK]]
    for i, rows in enumerate(seen[: BLOCK - 2], start=2):
        masked_before = torch.nonzero(first_block[i - 1][0] == model.mask_id).squeeze(1)
        assert torch.equal(rows, masked_before)
        assert len(rows) == len(torch.nonzero(first_block[i][0] == model.mask_id)) + 1


@pytest.mark.parametrize("reload", [2, 3, 8])
def test_dkv_counts_are_the_closed_form(model, reload):
    """Per block, passes 0, 1 and i mod R = 0 cost L; the others L |masked in the previous input| / N."""
    r = run(LladaDkvBackend(model, reload), model, 3)
    expected, full = 0.0, 0
    for nb in range(G // BLOCK):
        for i in range(BLOCK):
            if i <= 1 or i % reload == 0:
                expected += LAYERS
                full += 1
            else:
                masked_before = G - nb * BLOCK - (i - 1)  # one token a step
                expected += LAYERS * masked_before / N
    c = r.counters
    assert c.calls == G and c.layer_calls == LAYERS * G and c.refreshes == full
    assert c.layer_calls_weighted == pytest.approx(expected)


def test_cached_rows_fill_short_rows_with_a_repeat():
    pos = cached_rows(torch.tensor([[False, True, False, True], [False, False, True, False], [False] * 4]))
    assert pos.tolist() == [[1, 3], [2, 2], [0, 0]]


def test_unequal_row_counts_are_exact(model):
    """Rows with different numbers of rows to compute (not in the release's loop, whose rows commit
    alike): each sequence's logits are those of running it alone."""
    ids, pad = prompts(3, 5)
    canvas = torch.cat([ids, torch.full((3, G), model.mask_id)], dim=1)
    after = canvas.clone()
    after[0, P: P + 5] = 7  # sequence 0 decides 5, the others 1
    after[1:, P] = 9
    batch, alone = LladaDkvBackend(model, 8), [LladaDkvBackend(model, 8) for _ in range(3)]
    batch.set_padding(pad)
    batch.start()
    batch.begin_block(P, P + BLOCK)
    outs = [batch.logits(x) for x in (canvas, after, after, after)]
    for r, b in enumerate(alone):
        b.set_padding(pad[r: r + 1])
        b.start()
        b.begin_block(P, P + BLOCK)
        mine = [b.logits(x[r: r + 1]) for x in (canvas, after, after, after)]
        undecided = after[r] == model.mask_id
        keep = torch.arange(48) != model.mask_id
        torch.testing.assert_close(outs[-1][r, undecided][:, keep], mine[-1][0, undecided][:, keep],
                                   rtol=1e-5, atol=1e-5)


def test_bad_reload_is_one_line_naming_it(model):
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"^reload_every: must be an integer >= 1, got"):
            LladaDkvBackend(model, bad)


def test_the_catalog_rows():
    from tadm.caches.catalog import DKV_RELOAD
    from tadm.registry import LLADA_CACHES

    rows = LLADA_CACHES["dkv"].rows([2, 3], None)
    assert [label for label, _ in rows] == [f"dKV-Cache-Decode R={r}" for r in DKV_RELOAD] == [
        "dKV-Cache-Decode R=2", "dKV-Cache-Decode R=8"]
    assert [spec for _, spec in rows] == [CacheSpec("dkv", 2), CacheSpec("dkv", 8)]
    assert not any(spec.per_block for _, spec in rows)  # low-confidence, 1 token a step: the release's loop
    backend = rows[1][1].build(tiny_mha())
    assert type(backend) is LladaDkvBackend and backend.every == 8 and backend.budget_x is None


def test_dkv_rows_join_the_llada_group_when_listed():
    """Listed in asrd.llada_cache_methods (both profiles list it), the two rows run on the LLaDA
    baseline (low-confidence, 1 token a step), in registry order after the other methods' rows."""
    from tadm import config
    from tadm.experiments.asrd.llada import llada_variants
    from tadm.experiments.asrd.runner import BASELINE

    paper = config.render_profile("paper")
    assert "dkv" in paper["asrd"]["llada_cache_methods"]
    assert "dkv" in config.render_profile("default")["asrd"]["llada_cache_methods"]
    p = config.override(config.from_dict(paper), {"asrd.llada_cache_methods": ["dkv", "naive"]})
    every = {v.label: v for v in llada_variants(p, "gsm8k")}
    rows = [label for label, v in every.items() if v.cache is not None]
    assert rows == ["Naive reuse K=2", "Naive reuse K=3", "dKV-Cache-Decode R=2", "dKV-Cache-Decode R=8"]
    for label in rows[2:]:
        v = every[label]
        assert v.base == BASELINE and v.settings == every[BASELINE].settings
        assert v.settings.method == "low-confidence" and v.settings.threshold is None


def test_key_order_and_pre_rope_cache_are_rounding_only(model):
    """The release orders a cached pass's keys [computed; kept] and keeps K before RoPE; here they
    are in canvas order, after RoPE. The computed rows' logits agree to float32 rounding at every
    pass (worst |difference| over 3 prompts, R = 2 and 8, batch 3 unmasked, below 1e-4)."""
    worst = 0.0
    for reload in (2, 8):
        for seed in range(3):
            ids, _ = prompts(3, seed)
            trace: list = []
            ref_dkv_decode(model, ids, G, G, BLOCK, reload, trace=trace)
            backend = Unmasked(model, reload)
            outs: list = []
            orig = backend.logits
            backend.logits = lambda i, delta=None: outs.append(orig(i, delta)) or outs[-1]
            run(backend, model, 3, G, seed)
            assert len(outs) == len(trace)
            keep = torch.arange(48) != model.mask_id
            for out, (pos, ref) in zip(outs, trace):
                got = out.gather(1, pos.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
                worst = max(worst, float((got[..., keep] - ref[..., keep]).abs().max()))
    assert 0.0 <= worst < 1e-4, worst
