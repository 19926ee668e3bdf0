"""The comparison's tasks and layout, and the masked model's training objective."""

import json

import pytest
import torch

from tadm.asrd import tasks as T
from tadm.errors import ConfigError, DataError


class CharTokenizer:
    """One token per character (id = ord - 31), EOS = 0: enough to test the layout."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) - 31 for c in t] for t in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 31) for i in ids if i)


def test_reversal_sets_are_deterministic_disjoint_and_scored_exactly():
    words = [f"w{i}" for i in range(30)]
    train, held = T.reversal_sets(words, 50, 20, seed=4, min_words=3, max_words=5)
    again, _ = T.reversal_sets(words, 50, 20, seed=4, min_words=3, max_words=5)
    assert train.prompts == again.prompts and len(train) == 50 and len(held) == 20
    assert not set(train.prompts) & set(held.prompts)
    for p, r in zip(train.prompts, train.responses):
        line = p.removeprefix(T.REVERSAL_PREFIX).split()
        assert 3 <= len(line) <= 5 and r.split() == line[::-1]
    assert held.score(0, " " + held.answers[0] + " ") and not held.score(0, held.answers[0] + " extra")


def test_frequent_words_come_from_the_corpus(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "To be, or not to be: that is the Question. To"}) + "\n")
    assert T.frequent_words(f, 3) == ["to", "be", "is"]  # 3x, 2x, then ties alphabetically
    with pytest.raises(DataError, match="reversal_vocabulary"):
        T.frequent_words(f, 50)


def test_the_layout_left_pads_prompts_and_decodes_up_to_eos():
    layout = T.Layout(CharTokenizer(), prompt_tokens=6, response_tokens=5)
    x = layout.encode(["abc", "abcdef"], ["xy", "z"])
    assert x.shape == (2, 11) and layout.region.tolist() == [False] * 6 + [True] * 5
    assert x[0, :3].tolist() == [0, 0, 0] and layout.decode(x) == ["xy", "z"]
    assert layout.decode(layout.encode(["abc"])) == [""]  # the response part starts as EOS
    with pytest.raises(ConfigError, match="asrd.prompt_tokens"):
        layout.encode(["abcdefg"])
    with pytest.raises(ConfigError, match="asrd.response_tokens"):
        layout.encode(["a"], ["vwxyz"])  # 5 tokens + EOS > 5


def test_the_training_loss_never_masks_the_prompt_and_is_the_response_nelbo(tiny_models):
    from tadm.asrd.train import response_nelbo

    model = tiny_models["mdlm"]
    seen = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    x = torch.randint(0, 11, (16, 12), generator=torch.Generator().manual_seed(0))
    region = torch.zeros(12, dtype=torch.bool)
    region[5:] = True
    loss = response_nelbo(model, x, region, torch.Generator().manual_seed(1))
    hook.remove()
    z = seen[0]
    assert torch.equal(z[:, :5], x[:, :5]) and bool((z[:, 5:] == model.mask_id).any())
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.embed.weight.grad is not None
