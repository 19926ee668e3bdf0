"""The judge's controls and its validation figure: the word-shuffled control permutes words
within each line and keeps the layout (newlines), and the validation NLL is normalised as the
AR model's val_nelbo (same sequences, summed NLL over sequences x L tokens), so
metrics/evaluator.json's val_nll compares directly with metrics/train/<model>.json."""

import numpy as np
import pytest
import torch

from tadm import config
from tadm.losses import ar_nll
from tadm.metrics import trained_evaluator as te

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n")


def test_word_shuffle_keeps_every_newline_and_each_lines_words():
    texts = [TEXT, "one line only with several words in it", "\n\nlead and trail\n"]
    out = te.word_shuffled(texts, seed=0)
    for t, s in zip(texts, out):
        assert s.count("\n") == t.count("\n")  # the old control joined all words by spaces: no newline left
        assert [sorted(line.split()) for line in s.split("\n")] == [sorted(line.split()) for line in t.split("\n")]
    assert out != [" ".join(t.split()) for t in texts]
    # words do move within lines
    assert any(a.split() != b.split() for a, b in zip(out[0].split("\n"), TEXT.split("\n")))
    assert te.word_shuffled(texts, seed=0) == out


def test_word_shuffle_moves_no_word_across_lines():
    text = "\n".join(f"a{i} b{i} c{i} d{i}" for i in range(20))
    for seed in range(5):
        for i, line in enumerate(te.word_shuffled([text], seed)[0].split("\n")):
            assert {w[1:] for w in line.split()} == {str(i)}


def test_the_corruption_ladder_replaces_a_growing_share_of_each_lines_words():
    text = "\n".join(f"a{i} b{i} c{i} d{i} e{i} f{i} g{i} h{i} i{i} j{i}" for i in range(20))
    pool = set(text.split())
    assert te.word_replaced([text], 0.0, seed=0) == [text]
    changed = []
    for f in te.LADDER:
        out = te.word_replaced([text], f, seed=0)[0]
        assert out.count("\n") == text.count("\n") and set(out.split()) <= pool  # the layout and the unigram kept
        lines = [(a.split(), b.split()) for a, b in zip(out.split("\n"), text.split("\n"))]
        assert all(len(a) == len(b) for a, b in lines)
        changed.append(sum(x != y for a, b in lines for x, y in zip(a, b)))
        assert changed[-1] <= round(f * 10) * 20  # at most the share drawn (a draw may hit the word itself)
        assert te.word_replaced([text], f, seed=0)[0] == out and (f == 0 or te.word_replaced([text], f, seed=1)[0] != out)
    assert changed == sorted(changed) and changed[-1] > 0.8 * 200


def test_the_ladder_goes_past_word_salad_by_replacing_characters():
    text = "\n".join(f"alpha{i} beta{i} gamma{i} delta{i}" for i in range(30))
    alphabet = {c for c in text if not c.isspace()}
    assert te.char_replaced([text], 0.0, seed=0) == [text]
    changed = []
    for f in te.CHAR_LADDER:
        out = te.char_replaced([text], f, seed=0)[0]
        assert len(out) == len(text) and [c.isspace() for c in out] == [c.isspace() for c in text]  # layout kept
        assert {c for c in out if not c.isspace()} <= alphabet
        changed.append(sum(a != b for a, b in zip(out, text)))
        assert te.char_replaced([text], f, seed=0)[0] == out != te.char_replaced([text], f, seed=1)[0]
    assert changed == sorted(changed) and changed[0] > 0
    rungs = te.ladder_texts([text], seed=0)
    assert [(k, f) for k, f, _ in rungs] == [("words", f) for f in te.LADDER] + [("chars", f) for f in te.CHAR_LADDER]
    assert rungs[0][2] == [text] and rungs[len(te.LADDER) - 1][2] == te.word_replaced([text], 1.0, seed=0)
    salad = te.word_replaced([text], 1.0, seed=0)
    assert rungs[-1][2] == te.char_replaced(salad, te.CHAR_LADDER[-1], seed=0)  # on the word salad


def test_validation_nll_is_the_ar_models_val_nelbo_normalisation():
    p = config.override(config.load(config.PROFILES_DIR / "default.yaml"),
                        {"eval.trained.d_model": 16, "eval.trained.n_layers": 1, "eval.trained.n_heads": 2})
    torch.manual_seed(0)
    model = te.build(p, vocab=50, seq_len=12, bos_id=0, eos_id=0)
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 50, 12).astype(np.int64) for _ in range(7)]  # int64 rows, as PackedTokens
    nll, tokens, scored = te.validation_nll(model, data, count=5, batch=2, device=torch.device("cpu"))
    assert (tokens, scored) == (5 * 12, 5 * 11)  # the first 5 sequences; all tokens in the denominator
    x = torch.stack([torch.from_numpy(d) for d in data[:5]])
    with torch.no_grad():
        want = float(ar_nll(model(input_ids=x).logits, x).sum()) / x.numel()  # tadm.train.trainer.evaluate's figure
    assert nll == pytest.approx(want, rel=1e-5)
