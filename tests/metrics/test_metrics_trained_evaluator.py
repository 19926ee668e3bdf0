"""The evaluator stage's pieces that need no training: the "trained" name resolves to the
stage's model directory (a clear error before the stage ran), word shuffling is a seeded
permutation of each text's words, and the learning-rate schedule's closed form."""

import math

import pytest

from tadm import config
from tadm.errors import DataError
from tadm.metrics import trained_evaluator as te


def test_trained_resolves_to_the_stage_output_or_says_which_stage_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="run the evaluator stage first"):
        te.resolve("trained")
    (tmp_path / "models/evaluator").mkdir(parents=True)
    (tmp_path / "models/evaluator/config.json").write_text("{}")
    assert te.resolve("trained") == "models/evaluator"
    assert te.resolve("gpt2-large") == "gpt2-large"  # other names pass through


def test_word_shuffle_keeps_the_words_and_is_seeded():
    texts = ["to be or not to be", "that is the question"]
    a, b = te.word_shuffled(texts, seed=0), te.word_shuffled(texts, seed=0)
    assert a == b
    assert [sorted(t.split()) for t in a] == [sorted(t.split()) for t in texts]
    assert te.word_shuffled(texts, seed=1) != a or len(set(texts[0].split())) < 2


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    p = config.override(config.load(config.PROFILES_DIR / "default.yaml"),
                        {"eval.trained.lr": 1e-3, "eval.trained.warmup_steps": 10, "eval.trained.steps": 110})
    assert te.learning_rate(4, p) == pytest.approx(5e-4)
    assert te.learning_rate(10, p) == pytest.approx(1e-3)
    assert te.learning_rate(60, p) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2))))
    assert te.learning_rate(110, p) == pytest.approx(1e-4)


def test_build_is_a_gpt2_sized_by_the_profile():
    p = config.override(config.load(config.PROFILES_DIR / "default.yaml"),
                        {"eval.trained.d_model": 16, "eval.trained.n_layers": 1, "eval.trained.n_heads": 2})
    m = te.build(p, vocab=50, seq_len=12, bos_id=0, eos_id=0)
    assert type(m).__name__ == "GPT2LMHeadModel"
    assert (m.config.n_embd, m.config.n_layer, m.config.n_positions, m.config.vocab_size) == (16, 1, 12, 50)
    assert m.lm_head.weight.data_ptr() != m.transformer.wte.weight.data_ptr()  # untied: one tensor per name
