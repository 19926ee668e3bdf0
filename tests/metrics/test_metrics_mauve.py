"""MAUVE on real text: two halves of one source agree, corrupted text does not.

100 vs 100 passages of 80 words (10 histogram bins, mauve's "auto"). With the SmolLM2 featurizer
(its mean final state, order-aware; 40-word passages) word-shuffled passages score low. The
MiniLM option mean-pools a bag-of-words-like encoder: blind to word order (word-shuffled
passages score ~0.95 against real ones with it, documented below), it still rejects
letter-scrambled words. GPT-2 Large's last-token features, the paper's, see word order too.
"""

import numpy as np
import pytest

from tadm.metrics.mauve import DEFAULTS, mauve_from_features, mauve_score, mauve_score_features
from tests.metrics.conftest import scramble_letters, shuffle_words

N = 100


def text_sets(passages, words: int | None = None) -> dict[str, list[str]]:
    """p and q: two disjoint sets of N passages (each cut to its first `words` words); p's
    passages letter-scrambled and word-shuffled."""
    short = [" ".join(t.split()[:words]) for t in passages[:2 * N]]
    p, q = short[:N], short[N:]
    return {"p": p, "q": q, "scrambled": [scramble_letters(t, i) for i, t in enumerate(p)],
            "shuffled": [shuffle_words(t, i) for i, t in enumerate(p)]}


@pytest.fixture(scope="module")
def texts(passages):
    return text_sets(passages)


@pytest.fixture(scope="module")
def features(texts, minilm):
    return {k: minilm.encode(v) for k, v in texts.items()}


SMOLLM2_WORDS = 40  # the first 40 words of each passage: half the encoding (137 s against ~300 s on one
# AVX2 core), and still real vs held-out 0.96, word-shuffled 0.06


@pytest.fixture(scope="module")
def smollm2_features(passages, smollm2):
    from tadm.metrics.features import load_featurizer

    texts = text_sets(passages, SMOLLM2_WORDS)
    featurizer = load_featurizer("smollm2", cache_dir=smollm2[1], batch_size=16)
    return {k: featurizer.encode(texts[k]) for k in ("p", "q", "shuffled")}


def test_smollm2_featurizer_real_vs_held_out_high_and_word_shuffled_low(smollm2_features):
    same = mauve_score_features(smollm2_features["p"], smollm2_features["q"])
    shuffled = mauve_score_features(smollm2_features["shuffled"], smollm2_features["q"])
    print(f"MAUVE (smollm2 features) real vs held-out real: {same:.4f}; word-shuffled vs real: {shuffled:.4f}")
    assert same >= 0.9 and shuffled <= 0.1


def test_minilm_is_blind_to_word_order(features):
    assert mauve_score_features(features["shuffled"], features["q"]) >= 0.5  # why it is not the default


def test_two_halves_of_the_same_text_score_high(features):
    score = mauve_score_features(features["p"], features["q"])
    print(f"MAUVE real vs held-out real: {score:.4f}")
    assert score >= 0.9


def test_scrambled_text_scores_low(features):
    score = mauve_score_features(features["scrambled"], features["q"])
    print(f"MAUVE scrambled vs real: {score:.4f}")
    assert score <= 0.1


def test_deterministic_and_settings_are_mauves_defaults(features):
    out = mauve_from_features(features["p"], features["q"])
    again = mauve_from_features(features["p"], features["q"])
    assert out.mauve == again.mauve and out.num_buckets == N // 10
    assert DEFAULTS["seed"] == 25 and DEFAULTS["mauve_scaling_factor"] == 5 and DEFAULTS["num_buckets"] == "auto"
    assert mauve_from_features(features["p"], features["q"], num_buckets=4).num_buckets == 4
    # the thread count is a speed knob only
    assert mauve_score_features(features["p"], features["q"], num_threads=None) == pytest.approx(out.mauve, abs=1e-3)


class Lookup:
    """A featurizer that returns precomputed rows: the text path without encoding again."""

    def __init__(self, texts, features):
        self.rows = {t: f for k in texts for t, f in zip(texts[k], features[k])}

    def encode(self, texts):
        return np.stack([self.rows[t] for t in texts])


def test_text_path_equals_feature_path(texts, features):
    f = Lookup(texts, features)
    assert mauve_score(texts["p"], texts["q"], f) == mauve_score_features(features["p"], features["q"])


def test_bad_inputs_name_the_argument(texts, features):
    f = Lookup(texts, features)
    p, q = features["p"], features["q"]
    cases = [
        (lambda: mauve_score([], texts["q"], f), "p_texts"),
        (lambda: mauve_score(texts["p"], "one string", f), "q_texts"),
        (lambda: mauve_score(texts["p"], [1, 2], f), "q_texts"),
        (lambda: mauve_score_features(np.zeros((0, 384)), q), "p_features"),
        (lambda: mauve_score_features(p, q[:, :10]), "p_features and q_features"),
        (lambda: mauve_score_features(p, np.full_like(q, np.nan)), "q_features"),
        (lambda: mauve_score_features(p[0], q), "p_features"),
        (lambda: mauve_score_features(p, q, num_buckets=1), "num_buckets"),
        (lambda: mauve_score_features(p, q, num_buckets="many"), "num_buckets"),
        (lambda: mauve_score_features(p, q, scaling=3), "unknown MAUVE setting"),
        (lambda: mauve_score_features(p, q, num_threads=0), "num_threads"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


def test_faiss_kmeans_size_warning_is_dropped_and_other_stderr_kept(capfd):
    """mauve's n / 10 buckets sit under faiss's 39 points per centroid: faiss's C++ warning line is
    dropped (it flooded notebooks), anything else written to fd 2 in the block still shows."""
    import os

    from tadm.metrics import mauve as m

    rng = np.random.default_rng(0)
    m.mauve_score_features(rng.normal(size=(256, 8)), rng.normal(size=(256, 8)))
    with m._without_faiss_warnings():
        os.write(2, b"WARNING clustering 512 points to 26 centroids: please provide at least 1014 training points\n")
        os.write(2, b"something else\n")
    err = capfd.readouterr().err
    assert "WARNING clustering" not in err and "something else" in err
