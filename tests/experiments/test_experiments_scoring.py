"""Table 2's scorer: one model as evaluator and featurizer (one forward pass for both), the
reference features cached on disk and reused by the next Scorer."""

from __future__ import annotations

import numpy as np
import pytest

from tadm import config, runtime
from tadm.data.tokenizer import load_tokenizer
from tadm.experiments import table2
from tadm.metrics import gen_ppl_and_features
from tadm.metrics.evaluator import load_evaluator
from tadm.metrics.features import LastToken, load_featurizer
from tadm.metrics.gen_ppl import gen_ppl_ids
from tests.experiments.conftest import EVAL_POSITIONS, table2_raw


@pytest.fixture(scope="module")
def params(table2_workspace, evaluator_dir):
    return config.from_dict(table2_raw(table2_workspace, evaluator_dir))


def _scorer(p, micro_packed):
    return table2.Scorer(p, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed, dist=runtime.Dist())


def test_last_token_features_and_gen_ppl_from_one_pass_equal_the_separate_computations(evaluator_dir):
    ev = load_evaluator(str(evaluator_dir))
    eos = "<|endoftext|>"
    long = " ".join(f"word{i}" for i in range(60))  # > 2 contexts of the evaluator
    texts = ["Hello there, friend.", f"{eos}To be or not to be{eos}that is", long, "", "x", long[:150]]
    ppl, features = gen_ppl_and_features(texts, ev, batch_size=2, pooling="last")
    separate = gen_ppl_ids([ev.encode(t) or [ev.eos_id] for t in texts], ev, batch_size=2)  # same batches
    np.testing.assert_allclose(ppl.nll, separate.nll, rtol=1e-5)
    np.testing.assert_array_equal(ppl.tokens, separate.tokens)
    assert max(len(ev.encode(t)) for t in texts) > 2 * EVAL_POSITIONS
    featurizer = load_featurizer(str(evaluator_dir), batch_size=4)
    assert isinstance(featurizer, LastToken)
    np.testing.assert_allclose(features, featurizer.encode(texts), rtol=1e-4, atol=1e-5)


def test_the_scorer_loads_one_model_when_the_evaluator_is_the_featurizer(params, micro_packed):
    scorer = _scorer(params, micro_packed)
    assert scorer.joint and scorer.pooling == "last" and scorer.featurizer is None
    assert scorer._evaluator is None  # nothing loads before it is needed
    metrics = scorer.score(scorer.data_tokens())
    assert 0 <= metrics["mauve"] <= 1 and metrics["gen_ppl"] > 1 and metrics["entropy"] > 0


def test_reference_features_are_cached_and_reused_by_the_next_scorer(params, micro_packed, tmp_path, monkeypatch):
    p = config.override(params, {"eval.cache_dir": str(tmp_path / "cache")})
    first = _scorer(p, micro_packed)
    features = first.reference_features
    assert first.reference_source == "computed"
    cached = sorted((tmp_path / "cache").glob("reference_features-*.npy"))
    assert len(cached) == 1 and cached[0].with_suffix(".json").is_file()

    from tadm.metrics import scorer as scorer_module

    def fail(*args, **kwargs):
        raise AssertionError("the reference texts were featurized again")

    second = _scorer(p, micro_packed)
    with monkeypatch.context() as m:
        m.setattr(scorer_module, "gen_ppl_and_features", fail)  # where the scorer looks it up
        again = second.reference_features
    assert second.reference_source == "cache"
    np.testing.assert_array_equal(again, features)
    # and it scores exactly as the scorer that computed them
    tokens = first.data_tokens()
    assert second.score(tokens) == first.score(tokens)
    # another batch size (other padding, other last bits) is another cache entry
    third = _scorer(config.override(p, {"eval.batch_size": 3}), micro_packed)
    third.reference_features
    assert third.reference_source == "computed" and len(list((tmp_path / "cache").glob("*.npy"))) == 2


def test_a_separate_featurizer_is_loaded_when_it_is_another_model(params, micro_packed, tmp_path):
    p = config.override(params, {"eval.featurizer": "minilm", "eval.cache_dir": str(tmp_path)})
    scorer = _scorer(p, micro_packed)
    assert not scorer.joint and scorer.featurizer is not None
    assert scorer.reference_features.shape == (6, scorer.featurizer.dim)
    again = _scorer(p, micro_packed)
    assert again.reference_features.shape == (6, 384) and again.reference_source == "cache"
