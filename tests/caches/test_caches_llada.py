"""Training-free caches on LLaDA (tadm.caches.llada; design T8-T12): the block's maths repeated
bit for bit, Fast-dLLM's prefix / dual cache, dLLM-Cache's feature cache and naive reuse against
the base, their layer-call counts against the closed forms, the config keys and the table rows."""

import math

import pytest
import torch

from tadm import config
from tadm.asrd.backends import LladaBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.caches import llada as C
from tadm.caches.catalog import CacheSpec
from tadm.errors import ConfigError
from tadm.registry import LLADA_CACHES
from tadm.models import llada

P, G, BLOCK = 6, 12, 4  # prompt rows (left-padded in row 1), generated rows, semi-AR block
N = P + G


def tiny_model(seed: int = 0, kv_heads: int | None = 1) -> llada.LladaModel:
    """A random LLaDA: 4 layers, d 32, 2 heads sharing `kv_heads` kv heads (None: their own, MHA), vocab 40
    (+ the mask, 45)."""
    cfg = llada.LladaConfig(d_model=32, n_heads=2, n_kv_heads=kv_heads, n_layers=4, mlp_hidden_size=48, vocab_size=40,
                            embedding_size=48, rope_theta=10000.0, rms_norm_eps=1e-5, include_bias=False,
                            weight_tying=False, mask_token_id=45, max_sequence_length=64)
    torch.manual_seed(seed)
    model = llada.LladaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.4 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def canvas(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(canvas (2, N), region (N,), padding (2, N)): two prompts, the second left-padded by 2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.randint(2, 40, (2, P), generator=g), torch.full((2, G), model.mask_id)], dim=1)
    padding = torch.ones(2, N, dtype=torch.bool)
    ids[1, :2], padding[1, :2] = 1, False
    return ids, torch.arange(N) >= P, padding


def run(backend, model, settings, seed: int = 0):
    ids, region, padding = canvas(model, seed)
    backend.set_padding(padding)
    return decode(backend, ids, region, settings)


LOW = DecodeSettings(method="low-confidence", steps=G, block_size=BLOCK)  # 1 token a step: BLOCK passes a block
THRESHOLD = LOW.replace(threshold=0.3)


# --------------------------------------------------------------------------- T8: the block's maths


@pytest.mark.parametrize("full_precision", [True, False])
def test_rotary_at_is_llada_rotary(full_precision):
    x = torch.randn(2, 3, 9, 8).to(torch.float32 if full_precision else torch.bfloat16)
    ref = llada.rotary(x, 500000.0, full_precision)
    assert torch.equal(C.rotary_at(x, torch.arange(9), 500000.0, full_precision), ref)
    assert torch.equal(C.rotary_at(x, torch.arange(9), 500000.0, full_precision, span=20), ref)
    # rows at their own positions, shared or per sequence: the same rotation as in the full canvas
    rows = torch.tensor([1, 4, 8])
    assert torch.equal(C.rotary_at(x[:, :, rows], rows, 500000.0, full_precision), ref[:, :, rows])
    per_seq = torch.tensor([[0, 5, 6], [2, 3, 8]])
    got = C.rotary_at(torch.stack([x[0][:, per_seq[0]], x[1][:, per_seq[1]]]), per_seq, 500000.0, full_precision)
    assert torch.equal(got, torch.stack([ref[0][:, per_seq[0]], ref[1][:, per_seq[1]]]))
    assert not torch.equal(C.rotary_at(x[:, :, rows], rows + 1, 500000.0, full_precision), ref[:, :, rows])


@torch.no_grad()
def test_block_forward_is_the_block(model):
    x = torch.randn(2, N, 32)
    keys = llada.padding_keys(canvas(model)[2], (2, N), x.device)
    for block in model.blocks:
        for mask in (None, keys):
            got: dict = {}
            assert torch.equal(C.block_forward(block, x, mask), block(x, mask))
            assert torch.equal(C.block_forward(block, x, mask, capture=got), block(x, mask))
            assert got["k"].shape == got["v"].shape == (2, 1, N, 16) and got["attn"].shape == got["ffn"].shape == x.shape
    # the suffix rows against the kept K/V of the rows before them: the full pass's rows, up to rounding
    block, got = model.blocks[1], {}
    full = C.block_forward(block, x, keys, capture=got)
    lo = 7
    part = C.block_forward(block, x[:, lo:], keys, kv=(got["k"], got["v"]), positions=torch.arange(lo, N))
    torch.testing.assert_close(part, full[:, lo:], rtol=1e-5, atol=1e-5)
    wrong = C.block_forward(block, x[:, lo:], keys, kv=(got["k"], got["v"]), positions=torch.arange(N - lo))
    assert (wrong - full[:, lo:]).abs().max() > 1e-3  # the positions matter


# --------------------------------------------------------------------------- T9: K = 1 is the base


@pytest.mark.parametrize("settings", [LOW, THRESHOLD], ids=["low-confidence", "threshold"])
def test_prefix_and_dual_cache_at_k1_are_the_base(model, settings):
    base = run(LladaBackend(model), model, settings)
    for dual in (False, True):
        r = run(C.LladaPrefixCacheBackend(model, 1, dual=dual), model, settings)
        assert torch.equal(r.tokens, base.tokens)
        c = r.counters
        assert c.calls == base.counters.calls and c.refreshes == c.calls
        assert c.layer_calls == c.layer_calls_weighted == base.counters.layer_calls_weighted == 4 * c.calls


# --------------------------------------------------------------------------- T10: a reuse pass


def _base_logits(model, ids, padding):
    out = model(ids, attention_mask=padding).float()
    out[..., model.mask_id] = float("-inf")
    return out


@torch.no_grad()
@pytest.mark.parametrize("dual", [False, True], ids=["prefix", "dual"])
def test_a_reuse_pass_on_the_same_ids_is_the_full_pass(model, dual):
    ids, _, padding = canvas(model)
    lo, hi = P + BLOCK, P + 2 * BLOCK
    backend = C.LladaPrefixCacheBackend(model, 3, dual=dual)
    backend.set_padding(padding)
    backend.start()
    backend.begin_block(lo, hi)
    first = backend.logits(ids)
    second = backend.logits(ids)
    assert backend.counters.refreshes == 1 and backend.counters.calls == 2
    end = hi if dual else N
    ref = _base_logits(model, ids, padding)
    assert torch.equal(first, ref)
    keep = torch.arange(48) != model.mask_id
    torch.testing.assert_close(second[:, lo:end][..., keep], ref[:, lo:end][..., keep], rtol=1e-5, atol=1e-5)
    assert torch.equal(second[:, :lo], first[:, :lo])  # rows not computed: the last full pass's
    assert backend.counters.layer_calls_weighted == pytest.approx(4 + 4 * (end - lo) / N)


class BlockCausal(C.LladaPrefixCacheBackend):
    """Test only: the prompt and each block attend to themselves and what comes before."""

    def key_mask(self, shape, device):
        group = torch.clamp((torch.arange(N) - P) // BLOCK + 1, min=0)
        return (group[None, :] <= group[:, None])[None, None]


@torch.no_grad()
@pytest.mark.parametrize("dual", [False, True], ids=["prefix", "dual"])
def test_on_a_block_causal_model_the_cache_is_exact_for_any_k(model, dual):
    """A refresh, then reuse passes on canvases that changed from lo on: with block-causal keys
    the computed rows are the full pass's on each canvas (Fast-dLLM is exact there); with the
    bidirectional keys they are not (it is an approximation on LLaDA)."""
    ids, _, _ = canvas(model)
    lo, hi = P + BLOCK, P + 2 * BLOCK
    end = hi if dual else N
    keep = torch.arange(48) != model.mask_id
    for cls, exact in ((BlockCausal, True), (C.LladaPrefixCacheBackend, False)):
        cached, full = cls(model, 6, dual=dual), cls(model, 1, dual=dual)
        for b in (cached, full):
            b.start()
            b.begin_block(lo, hi)
        cached.logits(ids)
        worst = 0.0
        for step in range(4):
            changed = ids.clone()
            fresh = torch.randint(2, 40, (2, 5), generator=torch.Generator().manual_seed(step))
            changed[:, lo + step: lo + step + 5] = fresh
            got, ref = cached.logits(changed), full.logits(changed)
            worst = max(worst, float((got[:, lo:end][..., keep] - ref[:, lo:end][..., keep]).abs().max()))
        assert cached.counters.refreshes == 1 and full.counters.refreshes == 4
        assert (worst < 1e-5) if exact else (worst > 1e-3), worst


def _block_passes(per_block: int, k, lo_hi, weight):
    """Weighted layer calls of a decode with `per_block` passes a block (no early end): each
    block's first pass and, for an integer k, every k-th pass of the block is a full one."""
    total = 0.0
    for lo, hi in lo_hi:
        for t in range(per_block):
            full = t == 0 or (k != "block" and t % k == 0)
            total += 4 if full else 4 * weight(lo, hi)
    return total


@pytest.mark.parametrize("k", ["block", 2, 3])
def test_prefix_and_dual_counts_are_the_closed_forms(model, k):
    blocks = [(P + i, P + i + BLOCK) for i in range(0, G, BLOCK)]
    prefix = run(C.LladaPrefixCacheBackend(model, k), model, LOW).counters
    dual = run(C.LladaPrefixCacheBackend(model, k, dual=True), model, LOW).counters
    assert prefix.calls == dual.calls == G and prefix.layer_calls == dual.layer_calls == 4 * G
    assert prefix.layer_calls_weighted == pytest.approx(_block_passes(BLOCK, k, blocks, lambda lo, hi: (N - lo) / N))
    assert dual.layer_calls_weighted == pytest.approx(_block_passes(BLOCK, k, blocks, lambda lo, hi: (hi - lo) / N))
    assert dual.layer_calls_weighted < prefix.layer_calls_weighted < 4 * G


FIRST_PASS = LOW.replace(threshold=0.05)  # on the tiny model the full pass decides some blocks whole


def _release_calls(passes: list[int]) -> int:
    """Model calls of the release's loop (Fast-dLLM @24cc59e, `generate_with_prefix_cache` /
    `generate_with_dual_cache`, threshold set), traced by hand, for blocks that a loop stopping
    as soon as the block is decided finishes in `passes` passes each. The release makes the
    block's full pass, then ``while True``: a cached pass, break once the block is decided. Its
    cached passes commit what passes 2.. commit, and a block the full pass decided still gets
    one cached pass (it decides nothing): 1 + max(1, n - 1) calls a block."""
    return sum(1 + max(1, n - 1) for n in passes)


@pytest.mark.parametrize("dual", [False, True], ids=["prefix", "dual"])
def test_per_block_caches_count_the_release_loops_cached_pass(model, dual):
    """Refreshed per block, a block the full pass decided still costs one reuse pass (the
    release's count); it decides nothing, so the tokens are those of stopping at once."""
    blocks = [(P + i, P + i + BLOCK) for i in range(0, G, BLOCK)]
    ids, region, padding = canvas(model)
    backend = C.LladaPrefixCacheBackend(model, "block", dual=dual)
    backend.set_padding(padding)
    steps: list[int] = []
    r = decode(backend, ids, region, FIRST_PASS, callback=lambda rec: steps.append(rec.block))
    passes = [steps.count(b) for b in range(len(blocks))]
    assert 1 in passes and max(passes) > 1  # the case: some blocks decided by their full pass, some not
    c = r.counters
    assert r.steps == sum(passes) and c.calls == _release_calls(passes) > sum(passes)
    assert c.refreshes == len(blocks) and c.layer_calls == 4 * c.calls  # the extra pass is a reuse pass
    reuse = [((hi if dual else N) - lo) / N for lo, hi in blocks]
    assert c.layer_calls_weighted == pytest.approx(sum(4 + 4 * w * max(1, n - 1) for w, n in zip(reuse, passes)))
    stopping = C.LladaPrefixCacheBackend(model, "block", dual=dual)
    stopping.min_block_passes = 1  # the loop that stops as soon as the block is decided
    s = run(stopping, model, FIRST_PASS)
    assert torch.equal(r.tokens, s.tokens) and s.counters.calls == sum(passes)


def test_the_base_and_the_k_forms_make_no_extra_pass(model):
    """The release's `generate` (the base) and the caches at an integer K end a block once it is
    decided: K = 1 is the base, call for call."""
    base = run(LladaBackend(model), model, FIRST_PASS)
    for dual in (False, True):
        r = run(C.LladaPrefixCacheBackend(model, 1, dual=dual), model, FIRST_PASS)
        assert torch.equal(r.tokens, base.tokens) and r.counters.calls == base.counters.calls == r.steps


# --------------------------------------------------------------------------- T11: dLLM-Cache


@pytest.mark.parametrize("settings", [LOW, THRESHOLD], ids=["low-confidence", "threshold"])
def test_feature_cache_at_k1_or_full_share_is_the_base(model, settings):
    base = run(LladaBackend(model), model, settings)
    every_pass = run(C.LladaFeatureCacheBackend(model, 1, 1, 0.25), model, settings)
    assert torch.equal(every_pass.tokens, base.tokens) and every_pass.counters.refreshes == every_pass.counters.calls
    verify_all = run(C.LladaFeatureCacheBackend(model, 1, 100, 1.0), model, settings)  # V-verify picks every row
    assert verify_all.counters.refreshes == 1
    assert torch.equal(verify_all.tokens, base.tokens)
    assert verify_all.counters.layer_calls_weighted == pytest.approx(base.counters.layer_calls_weighted)
    stale = run(C.LladaFeatureCacheBackend(model, 100, 100, 0.25), model, settings)  # one refresh, then V-verify
    assert stale.counters.refreshes == 1 and stale.counters.layer_calls_weighted < base.counters.layer_calls_weighted


def test_feature_cache_layer_zero_computes_every_row_and_the_others_the_picked(model):
    """On a pass where neither part is due, layer 0 runs every row and each later layer the
    floor(rho G) picked response rows (plus the prompt's when it is due)."""
    rows: list[tuple[int, int]] = []
    hooks = [b.q_proj.register_forward_hook(lambda mod, inp, out, i=i: rows.append((i, inp[0].shape[1])))
             for i, b in enumerate(model.blocks)]
    try:
        ids, _, padding = canvas(model)
        backend = C.LladaFeatureCacheBackend(model, 2, 3, 0.25)
        backend.set_padding(padding)
        backend.start()
        backend.begin_block(P, P + BLOCK)
        seen = []
        for _ in range(3):  # pass 1 full; pass 2 neither due; pass 3 the prompt due
            rows.clear()
            backend.logits(ids)
            seen.append(list(rows))
    finally:
        for h in hooks:
            h.remove()
    n_sel = math.floor(0.25 * G)
    assert seen[0] == [(i, N) for i in range(4)]
    assert seen[1] == [(0, N)] + [(i, n_sel) for i in (1, 2, 3)]
    assert seen[2] == [(0, N)] + [(i, P + n_sel) for i in (1, 2, 3)]
    assert backend.counters.layer_calls_weighted == pytest.approx(4 + 1 + 3 * n_sel / N + 1 + 3 * (P + n_sel) / N)


@torch.no_grad()
def test_v_verify_recomputes_the_rows_whose_v_moved_most(model):
    """After the refresh three response tokens are unmasked. At layer 1 (whose input, layer 0's
    output, is recomputed on every pass) V-verify recomputes the K of exactly the floor(0.25 G) = 3
    response rows per sequence whose new V is least cosine-similar to the cached one; every layer
    renews the V of every response row and no prompt row."""
    ids, _, padding = canvas(model)
    backend = C.LladaFeatureCacheBackend(model, 100, 100, 0.25)
    backend.set_padding(padding)
    backend.start()
    backend.begin_block(P, P + BLOCK)
    backend.logits(ids)
    before = [(st.k.clone(), st.v.clone()) for st in backend._states]
    changed = ids.clone()
    changed[:, [P + 1, P + 5, P + 10]] = torch.tensor([3, 17, 29])
    backend.logits(changed)
    block = model.blocks[1]
    x = model.blocks[0](model.embed(changed), llada.padding_keys(padding, (2, N), None))
    v_new = block.v_proj(block.attn_norm(x))[:, P:]  # one kv head: (B, G, head_dim)
    sim = torch.nn.functional.cosine_similarity(v_new, before[1][1][:, 0, P:], dim=-1)
    expected = torch.zeros(2, N, dtype=torch.bool)
    expected.scatter_(1, P + sim.topk(3, largest=False).indices, True)
    for i, (st, (k, v)) in enumerate(zip(backend._states[1:], before[1:]), start=1):
        recomputed = (st.k != k).any(-1).any(1)  # (B, N): rows whose K was recomputed
        assert recomputed.sum(-1).tolist() == [3, 3] and not recomputed[:, :P].any()
        if i == 1:
            assert torch.equal(recomputed, expected)
        assert (st.v != v).any(-1).any(1)[:, P:].all() and not (st.v != v)[:, :, :P].any()


@pytest.mark.parametrize("kp, kr, rho", [(3, 2, 0.3), (50, 7, 0.25), (2, 2, 0.5)])
def test_feature_cache_counts_are_the_closed_form(model, kp, kr, rho):
    r = run(C.LladaFeatureCacheBackend(model, kp, kr, rho), model, LOW)
    expected = 0.0
    for step in range(1, r.counters.calls + 1):
        prompt, response = (step - 1) % kp == 0, (step - 1) % kr == 0
        rows = P * prompt + (G if response else math.floor(rho * G))
        expected += 4 if prompt and response else 1 + 3 * rows / N
    assert r.counters.calls == G and r.counters.layer_calls == 4 * G
    assert r.counters.layer_calls_weighted == pytest.approx(expected)
    assert r.counters.refreshes == len([s for s in range(G) if s % kp == 0 and s % kr == 0])


# --------------------------------------------------------------------------- T12: blocks, naive reuse


class Recording(LladaBackend):
    def __init__(self, model):
        super().__init__(model)
        self.events: list = []

    def begin_block(self, lo, hi):
        self.events.append((lo, hi))

    def logits(self, ids, delta=None):
        self.events.append("pass")
        return super().logits(ids, delta)


@pytest.mark.parametrize("settings", [LOW, THRESHOLD, LOW.replace(method="plain")], ids=["low", "threshold", "plain"])
def test_begin_block_is_called_once_before_each_block(model, settings):
    backend = Recording(model)
    r = run(backend, model, settings)
    marks = [e for e in backend.events if e != "pass"]
    assert marks == [(P + i, P + i + BLOCK) for i in range(0, G, BLOCK)]
    assert backend.events[0] == marks[0] and backend.events.count("pass") == r.counters.calls
    base = run(LladaBackend(model), model, settings)
    assert torch.equal(r.tokens, base.tokens)


def test_naive_reuse_at_k1_is_the_base_and_reuses_the_output_between(model):
    base = run(LladaBackend(model), model, LOW)
    assert torch.equal(run(C.LladaNaiveReuseBackend(model, 1), model, LOW).tokens, base.tokens)
    backend = C.LladaNaiveReuseBackend(model, 2, split=(1, 2, 1))  # a front layer too
    ids, _, padding = canvas(model)
    backend.set_padding(padding)
    backend.start()
    first = backend.logits(ids)
    changed = ids.clone()
    changed[:, P:P + 3] = 7
    assert torch.equal(backend.logits(changed), first)  # the back layers read only the reused state
    assert not torch.equal(backend.logits(changed), first)  # a refresh reads the new canvas
    r = run(C.LladaNaiveReuseBackend(model, 3, split=(1, 2, 1)), model, LOW)
    assert r.counters.layer_calls == r.counters.layer_calls_weighted == 2 * G + 2 * math.ceil(G / 3)


def test_budgets_and_splits():
    assert C.scaled_split(32) == (2, 22, 8) and C.scaled_split(4) == (0, 3, 1) and C.scaled_split(2) == (0, 1, 1)
    assert C.LladaNaiveReuseBackend(tiny_model(), 2).split == (0, 3, 1)
    assert C.tadm_share(32, 2) == pytest.approx(21 / 32) and C.tadm_share(32, 3) == pytest.approx((10 + 22 / 3) / 32)
    with pytest.raises(ConfigError, match="asrd.llada_cache_refresh"):
        C.LladaPrefixCacheBackend(tiny_model(), 0)
    with pytest.raises(ConfigError, match="share: must be in"):
        C.LladaFeatureCacheBackend(tiny_model(), 1, 1, 0.0)


# --------------------------------------------------------------------------- config and rows


def _paper():
    return config.render_profile("paper")


@pytest.mark.parametrize("key, value, expected", [
    ("llada_cache_methods", ["prefix", "kv"],
     "asrd.llada_cache_methods[1]: no LLaDA cache 'kv' is registered (known: " + ", ".join(LLADA_CACHES.names()) + ")"),
    ("llada_cache_methods", ["naive", "naive"], "asrd.llada_cache_methods: must not repeat a value"),
    ("llada_cache_refresh", [2, 1], "asrd.llada_cache_refresh[1]: must be >= 2, got 1"),
    ("llada_cache_refresh", [3, 3], "asrd.llada_cache_refresh: must not repeat a value"),
    ("llada_dllm_cache", {"gsm8k": {"prompt_every": 0, "response_every": 7, "share": 0.25}},
     "asrd.llada_dllm_cache.gsm8k.prompt_every: must be >= 1, got 0"),
    ("llada_dllm_cache", {"gsm8k": {"prompt_every": 50, "response_every": 7, "share": 1.5}},
     "asrd.llada_dllm_cache.gsm8k.share: must be <= 1.0, got 1.5"),
    ("llada_dllm_cache", {"gsm8k": {"prompt_every": 50, "share": 0.25}},
     "asrd.llada_dllm_cache.gsm8k.response_every: missing key"),
    ("llada_dllm_cache", {"mmlu": {"prompt_every": 50, "response_every": 7, "share": 0.25}},
     "asrd.llada_dllm_cache.mmlu: unknown task"),
], ids=["method", "repeated-method", "k1", "repeated-k", "kp", "rho", "missing", "task"])
def test_bad_cache_keys_are_one_line_naming_the_key(key, value, expected):
    raw = _paper()
    raw["asrd"][key] = value
    with pytest.raises(ConfigError) as e:
        config.from_dict(raw)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_paper_profile_lists_the_cache_rows():
    from tadm.experiments.asrd.llada import llada_variants
    from tadm.experiments.asrd.runner import ASRD_BASE, BASELINE

    p = config.from_dict(_paper())
    assert config.render_profile("default")["asrd"]["llada_cache_methods"] == p.asrd.llada_cache_methods  # every key in default.yaml
    rows = {v.label: v for v in llada_variants(p, "humaneval")}
    cached = [label for label, v in rows.items() if v.cache is not None]
    assert cached == ["Fast-dLLM prefix cache (per block)", "Fast-dLLM dual cache (per block)",
                      "Fast-dLLM prefix cache K=2", "Fast-dLLM prefix cache K=3",
                      "dLLM-Cache (K_p=50, K_r=8, rho=0.25)", "dLLM-Cache K=2", "dLLM-Cache K=3",
                      "Naive reuse K=2", "Naive reuse K=3", "dKV-Cache-Decode R=2", "dKV-Cache-Decode R=8",
                      "d²Cache (as released)"]
    prior = "Low-confidence + certainty prior (sigma=10, one block)"  # d²Cache's decoder, without its cache
    assert list(rows).index(prior) == list(rows).index("d²Cache (as released)") - 1 and rows[prior].cache is None
    assert rows[prior].base == BASELINE and rows[prior].settings == rows[BASELINE].settings.replace(
        block_size=None, certainty_sigma=10.0)
    for label in cached:
        v = rows[label]
        assert v.settings == rows[v.base].settings
        if label.startswith("d²Cache"):  # as released: its prior over one block, one token a step
            assert v.base == prior and v.settings.block_size is None and v.settings.certainty_sigma == 10.0
            continue
        assert v.settings.block_size == p.asrd.llada_block_size and v.settings.certainty_sigma is None
        assert v.base == (ASRD_BASE if "per block" in label else BASELINE)
    assert rows["Fast-dLLM dual cache (per block)"].cache == CacheSpec("dual")
    assert rows["dLLM-Cache K=3"].cache == CacheSpec("feature", 3, 3, 0.25)
    assert "dLLM-Cache (K_p=50, K_r=7, rho=0.25)" in {v.label for v in llada_variants(p, "gsm8k")}
    only = config.override(p, {"asrd.llada_cache_methods": ["naive"], "asrd.llada_cache_refresh": [4]})
    assert [v.label for v in llada_variants(only, "gsm8k") if v.cache] == ["Naive reuse K=4"]
    model = tiny_model()
    kinds = {label: type(rows[label].cache.build(model)).__name__ for label in cached}
    assert kinds["Fast-dLLM dual cache (per block)"] == "LladaPrefixCacheBackend" and rows[cached[1]].cache.build(model).dual
    assert kinds["dLLM-Cache K=2"] == "LladaFeatureCacheBackend" and kinds["Naive reuse K=3"] == "LladaNaiveReuseBackend"
    d2 = rows["d²Cache (as released)"].cache.build(model)
    assert type(d2).__name__ == "LladaD2CacheBackend" and (d2.rollout_p, d2.current_k, d2.sigma, d2.inflate_w) == (
        0.1, 32, 10.0, 0)  # Kamichanw/d2Cache's configs/gen_args.py
    assert rows["Fast-dLLM prefix cache (per block)"].cache.build(model).budget_x is None
    assert rows["Naive reuse K=2"].cache.build(model).budget_x == pytest.approx(C.tadm_share(4, 2))


def test_the_table_shows_weighted_calls_against_the_own_base_and_matches_within_001():
    from tadm.experiments.asrd import compare

    def row(weighted, base=None, budget=None):
        return {"accuracy": 50.0, "accuracy_sd": 0.0, "tokens_per_s": 10.0, "calls_per_batch": 8.0,
                "layer_calls_per_batch": 32.0, "layer_calls_weighted_per_batch": weighted, "remasked_per_sequence": 0.0,
                "verified_per_sequence": 0.0, "base": base, "budget_x": budget, "batch_seconds": [1.0]}

    methods = {compare.BASELINE: row(32.0), compare.ASRD_BASE: row(32.0),
               "Naive reuse K=2": row(21.0, compare.BASELINE, 21 / 32),
               "dLLM-Cache K=2": row(19.0, compare.BASELINE, 21 / 32),
               "Fast-dLLM prefix cache (per block)": row(12.0, compare.ASRD_BASE)}
    df = compare.frame({"groups": [{"task": "gsm8k", "model": "llada", "methods": methods}]}).set_index("method")
    assert df.loc["Naive reuse K=2", "compute_x"] == pytest.approx(21 / 32) and df.loc["Naive reuse K=2", "matched"]
    assert df.loc["dLLM-Cache K=2", "compute_x"] == pytest.approx(19 / 32) and not df.loc["dLLM-Cache K=2", "matched"]
    assert not df.loc["Fast-dLLM prefix cache (per block)", "matched"] and math.isnan(df.loc[compare.BASELINE, "compute_x"])
    md = compare.to_markdown(df.reset_index())
    assert "| 0.656 (budget 0.656, matched) |" in md and "| 0.594 (budget 0.656) |" in md and "| 0.375 |" in md


def test_a_registered_cache_adds_its_rows_and_its_backend():
    from tadm.caches.catalog import LladaCache, add_llada_cache
    from tadm.experiments.asrd.llada import llada_variants
    from tadm.registry import LLADA_CACHES

    add_llada_cache(LladaCache("toy", lambda model, spec: LladaBackend(model),  # the base itself, as a toy
                               lambda ks, released: [(f"Toy K={k}", CacheSpec("toy", k)) for k in ks]))
    try:
        p = config.override(config.from_dict(_paper()), {"asrd.llada_cache_methods": ["toy", "dual"]})
        rows = {v.label: v for v in llada_variants(p, "gsm8k") if v.cache is not None}
        assert list(rows) == ["Fast-dLLM dual cache (per block)", "Toy K=2", "Toy K=3"]
        assert type(rows["Toy K=3"].cache.build(tiny_model())) is LladaBackend
    finally:
        LLADA_CACHES.unregister("toy")
    with pytest.raises(ConfigError, match=r"asrd.llada_cache_methods: no LLaDA cache 'toy' is registered"):
        CacheSpec("toy", 2).build(tiny_model())
