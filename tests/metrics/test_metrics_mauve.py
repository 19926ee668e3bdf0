"""MAUVE on real text: two halves of one source agree, corrupted text does not.

100 vs 100 passages of 80 words (10 histogram bins, mauve's "auto"). The corruption is
letter-scrambled words: all-MiniLM-L6-v2 mean-pools its token states, so it is close to blind to
word order (word-shuffled passages score ~0.9 against real ones with it) but not to the words
themselves. GPT-2 Large's last-token features, the paper's, do see word order.
"""

import numpy as np
import pytest

from tadm.metrics.mauve import DEFAULTS, mauve_from_features, mauve_score, mauve_score_features
from tests.metrics.conftest import scramble_letters

N = 100


@pytest.fixture(scope="module")
def texts(passages):
    p, q = passages[:N], passages[N:2 * N]
    return {"p": p, "q": q, "scrambled": [scramble_letters(t, i) for i, t in enumerate(p)]}


@pytest.fixture(scope="module")
def features(texts, minilm):
    return {k: minilm.encode(v) for k, v in texts.items()}


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
