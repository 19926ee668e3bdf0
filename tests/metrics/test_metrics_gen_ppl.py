"""Generative perplexity: real text beats shuffled text; MDLM's EOS cut and chunking."""

import math

import numpy as np
import pytest

from tadm.data.tokenizer import build_gpt2
from tadm.metrics.evaluator import load_evaluator
from tadm.metrics.gen_ppl import chunks, decode_samples, gen_ppl, gen_ppl_ids, scored_ids
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


def test_tokens_after_the_first_eos_do_not_count(smollm2):
    ev = smollm2[0]
    base = "The quality of mercy is not strained.<|endoftext|>"
    a = gen_ppl([base + "It droppeth as the gentle rain", "Hello there"], ev)
    b = gen_ppl([base + "zzz qqq xxx <|endoftext|> more", "Hello there"], ev)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.nll, b.nll, rtol=1e-6)
    assert a.tokens[0] == len(ev.encode(base)) - 1  # the EOS itself counts, the first token conditions
    # a leading EOS (the BOS of packed samples) only conditions
    lead = gen_ppl(["<|endoftext|>" + base], ev)
    assert lead.tokens[0] == len(ev.encode(base))


def test_scored_ids_and_chunks():
    assert scored_ids([5, 1, 2, 9, 2, 3], eos_id=2) == [5, 1, 2]
    assert scored_ids([2, 1, 2, 3], eos_id=2) == [2, 1, 2]
    assert scored_ids([5, 1, 7, 2], eos_id=2, max_length=3) == [5, 1, 7]
    assert chunks(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert chunks(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a 1-token tail scores nothing


def test_chunking_scores_each_piece_on_its_own(tiny):
    """A sequence longer than the context is cut into pieces scored independently: the same
    NLL as scoring the pieces as separate samples, and one conditioning token per piece."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50256, size=150).tolist()  # no EOS inside
    whole = gen_ppl_ids([ids], tiny, context_length=40)
    pieces = gen_ppl_ids([ids[i:i + 40] for i in range(0, 150, 40)], tiny)
    assert whole.tokens[0] == 150 - 4 == pieces.tokens.sum()
    assert whole.nll[0] == pytest.approx(pieces.nll.sum(), rel=1e-5)
    # the model's own context (64 positions) is the default chunk size
    default = gen_ppl_ids([ids], tiny)
    assert default.tokens[0] == 150 - math.ceil(150 / TINY_POSITIONS)
    assert math.isfinite(default.ppl) and default.ppl > 1
    # batching and padding do not change the numbers
    batched = gen_ppl_ids([ids, ids[:30], ids[:70]], tiny, batch_size=3)
    single = gen_ppl_ids([ids, ids[:30], ids[:70]], tiny, batch_size=1)
    np.testing.assert_allclose(batched.nll, single.nll, rtol=1e-5)


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
    texts = passages[:5] + [f"{eos}{passages[5]}{eos}{passages[6]}", "word"]  # EOS inside: counting stops there
    ppl, features = gen_ppl_and_features(texts, ev, batch_size=3)
    separate = gen_ppl(texts, ev, batch_size=2)
    np.testing.assert_allclose(ppl.nll, separate.nll, rtol=1e-4)
    np.testing.assert_array_equal(ppl.tokens, separate.tokens)
    assert ppl.ppl == pytest.approx(separate.ppl, rel=1e-4)
    reference = load_featurizer("smollm2", cache_dir=cache, batch_size=4).encode(texts)
    np.testing.assert_allclose(features, reference, rtol=1e-3, atol=1e-3)
