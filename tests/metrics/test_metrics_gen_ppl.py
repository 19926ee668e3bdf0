"""Generative perplexity: real text beats shuffled text; MDLM's EOS cut and chunking."""

import math

import numpy as np
import pytest

from tadm.data.tokenizer import build_gpt2
from tadm.metrics.evaluator import load_evaluator
from tadm.metrics.gen_ppl import GenPPL, decode_samples, gen_ppl, gen_ppl_ids, mdlm_target_mask
from tests.metrics.conftest import TINY_POSITIONS, shuffle_words

N = 12  # passages of 80 words, ~1,200 SmolLM2 tokens per set


@pytest.fixture(scope="module")
def tiny(tiny_gpt2_dir):
    return load_evaluator(str(tiny_gpt2_dir))


def test_real_text_is_far_more_likely_than_shuffled_text(smollm2, passages):
    ev = smollm2[0]
    real = gen_ppl(passages[:N], ev)
    shuffled = gen_ppl([shuffle_words(t, i) for i, t in enumerate(passages[:N])], ev)
    print(f"SmolLM2 Gen PPL: real {real.ppl:.1f}, word-shuffled {shuffled.ppl:.1f}")
    assert real.ppl * 5 <= shuffled.ppl
    assert real.nll.shape == real.tokens.shape == (N,) and (real.tokens > 50).all()
    assert real.ppl == pytest.approx(math.exp(real.nll.sum() / real.tokens.sum()))
    assert np.median(real.sample_ppl) < np.median(shuffled.sample_ppl)


def test_counted_tokens_follow_mdlm_s_rule_on_a_fixed_batch(tiny):
    """MDLM's compute_generative_perplexity, transcribed: right-pad the batch with EOS, split it
    into context-length chunks, per chunk nlls = CE(logits[..., :-1], chunk[..., 1:]) weighted by
    first_eos[..., 1:] + token_mask[..., 1:] with first_eos = cumsum(chunk == eos) == 1 and
    token_mask = chunk != eos. Our counts and summed NLL per row equal it."""
    import torch

    E = tiny.eos_id
    rows = [[7, 1, E, 3, 4, E, 5], [E, 2, 3, E, 4], [6, 7]]
    for ctx in (64, 4):
        out = gen_ppl_ids(rows, tiny, batch_size=3, context_length=ctx)
        tokens = torch.full((3, 7), E)
        mask = torch.zeros((3, 7), dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        nll, count = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.long)
        for chunk, chunk_mask in zip(tokens.split(ctx, -1), mask.split(ctx, -1)):
            with torch.no_grad():
                logits = tiny.model(chunk, attention_mask=chunk_mask)[0].transpose(-1, -2)
            nlls = torch.nn.functional.cross_entropy(logits[..., :-1], chunk[..., 1:], reduction="none")
            first_eos = (chunk == E).cumsum(-1) == 1
            token_mask = chunk != E
            w = first_eos[..., 1:] + token_mask[..., 1:]
            nll += (nlls * w).double().sum(-1)
            count += w.sum(-1)
        assert out.tokens.tolist() == count.tolist()
        np.testing.assert_allclose(out.nll, nll.numpy(), rtol=1e-5)
    # by hand, one chunk: row 0 counts all but its second EOS; row 1 (leading EOS) no EOS at all;
    # row 2 has no EOS and gets its first pad EOS counted
    assert gen_ppl_ids(rows, tiny, batch_size=3).tokens.tolist() == [5, 3, 2]
    assert mdlm_target_mask(torch.tensor([[7, 1, E, 3, 4, E, 5]]), E).tolist() == [[True] * 4 + [False, True]]


def test_tokens_after_an_eos_count_as_in_mdlm(smollm2):
    ev = smollm2[0]
    base = "The quality of mercy is not strained.<|endoftext|>"
    a = gen_ppl([base + "It droppeth as the gentle rain"], ev)
    assert a.tokens[0] == len(ev.encode(base + "It droppeth as the gentle rain")) - 1  # all but the first
    lead = gen_ppl(["<|endoftext|>" + base], ev)  # a leading EOS: no EOS target counts
    assert lead.tokens[0] == len(ev.encode(base)) - 1


def test_padding_of_a_text_without_eos_counts_its_first_pad_eos(tiny):
    """The released quirk, kept: every text is padded to the longest of the whole set (ReMDM's
    evaluation tokenizes the set at once), so a text with no EOS of its own that is shorter than
    the set's longest gets its first pad EOS counted, whatever its batch."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50256, size=150).tolist()  # no EOS inside
    batched = gen_ppl_ids([ids, ids[:30], ids[:70]], tiny, batch_size=3)
    single = gen_ppl_ids([ids, ids[:30], ids[:70]], tiny, batch_size=1)
    alone = [gen_ppl_ids([x], tiny).tokens[0] for x in (ids, ids[:30], ids[:70])]
    assert batched.tokens.tolist() == single.tokens.tolist()  # the batch no longer matters
    assert (batched.tokens - np.array(alone)).tolist() == [0, 1, 1]  # the set does
    assert batched.nll[0] == pytest.approx(single.nll[0], rel=1e-5)


def test_chunking_scores_each_piece_on_its_own(tiny):
    """A sequence longer than the context is cut into pieces scored independently: the same
    NLL as scoring the pieces as separate samples, and one conditioning token per piece."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50256, size=150).tolist()  # no EOS inside
    whole = gen_ppl_ids([ids], tiny, context_length=40)
    pieces = [gen_ppl_ids([ids[i:i + 40]], tiny) for i in range(0, 150, 40)]  # each alone: no padding
    assert whole.tokens[0] == 150 - 4 == sum(p.tokens.sum() for p in pieces)
    assert whole.nll[0] == pytest.approx(sum(p.nll.sum() for p in pieces), rel=1e-5)
    # the model's own context (64 positions) is the default chunk size
    default = gen_ppl_ids([ids], tiny)
    assert default.tokens[0] == 150 - math.ceil(150 / TINY_POSITIONS)
    assert math.isfinite(default.ppl) and default.ppl > 1


def test_decoded_samples_keep_bos_and_eos(tiny):
    tok = build_gpt2()
    samples = np.array([[50256, 15496, 995, 50256, 15496], [50256, 15496, 15496, 15496, 15496]])
    texts = decode_samples(samples, tok)
    assert texts[0] == "<|endoftext|>Hello world<|endoftext|>Hello"
    out = gen_ppl(texts, tiny)
    assert out.tokens.tolist() == [3, 4]  # Hello world EOS | four Hellos
    assert decode_samples([[15496, 995]], tok) == ["Hello world"]


def test_max_length_truncates_first(tiny):
    out = gen_ppl(["Hello world " * 20], tiny, max_length=10)
    assert out.tokens[0] == 9


def test_bad_inputs_name_the_argument(tiny):
    cases = [
        (lambda: gen_ppl([], tiny), "texts"),
        (lambda: gen_ppl("Hello", tiny), "texts"),
        (lambda: gen_ppl([3], tiny), "texts"),
        (lambda: gen_ppl(["Hello"], tiny), "too short"),
        (lambda: gen_ppl(["Hello world"], tiny, batch_size=0), "batch_size"),
        (lambda: gen_ppl(["Hello world"], tiny, context_length=1), "context_length"),
        (lambda: gen_ppl(["Hello world"], tiny, context_length=TINY_POSITIONS + 1), "context_length"),
        (lambda: gen_ppl(["Hello world"], tiny, max_length=1), "max_length"),
        (lambda: gen_ppl_ids([], tiny), "sequences"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


def test_one_pass_gen_ppl_and_features_equal_the_separate_computations(smollm2, passages):
    from tadm.metrics.features import load_featurizer
    from tadm.metrics.gen_ppl import gen_ppl_and_features

    ev, cache, _ = smollm2
    eos = "<|endoftext|>"
    short = [" ".join(t.split()[:20]) for t in passages[:7]]  # the equalities hold at any length
    texts = short[:5] + [f"{eos}{short[5]}{eos}{short[6]}", "word"]  # EOS inside
    ppl, features = gen_ppl_and_features(texts, ev, batch_size=3)
    separate = gen_ppl(texts, ev, batch_size=3)  # the same batches: counts depend on them (MDLM's padding)
    np.testing.assert_allclose(ppl.nll, separate.nll, rtol=1e-4)
    np.testing.assert_array_equal(ppl.tokens, separate.tokens)
    assert ppl.ppl == pytest.approx(separate.ppl, rel=1e-4)
    reference = load_featurizer("smollm2", cache_dir=cache, batch_size=4).encode(texts)
    np.testing.assert_allclose(features, reference, rtol=1e-3, atol=1e-3)


def test_ratio_per_unit_is_the_nll_gap_over_the_units():
    a = GenPPL(ppl=math.exp(3 / 4), nll=np.array([1.0, 2.0]), tokens=np.array([2, 2]))
    b = GenPPL(ppl=math.exp(7 / 4), nll=np.array([3.0, 4.0]), tokens=np.array([2, 2]))
    assert a.ratio_per(b, 4) == pytest.approx(b.ppl / a.ppl)  # the evaluator's own tokens: the plain ratio
    assert a.ratio_per(b, 2) == pytest.approx(math.exp(2.0))  # coarser units: the same gap over fewer of them
    assert b.ratio_per(a, 4) == pytest.approx(a.ppl / b.ppl)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="units"):
            a.ratio_per(b, bad)
