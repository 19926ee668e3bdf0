"""The comparison's tasks and layout, and the masked model's training objective."""

import pytest
import torch

from tadm.asrd import tasks as T
from tadm.errors import ConfigError


class CharTokenizer:
    """One token per character (id = ord - 31), EOS = 0: enough to test the layout."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) - 31 for c in t] for t in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 31) for i in ids if i)


@pytest.mark.parametrize("n, words", [(0, "zero"), (7, "seven"), (13, "thirteen"), (40, "forty"), (47, "forty-seven"),
                                      (100, "one hundred"), (101, "one hundred one"), (347, "three hundred forty-seven"),
                                      (999, "nine hundred ninety-nine")])
def test_number_words(n, words):
    assert T.number_words(n) == words


def test_spelling_sets_are_deterministic_hold_out_their_numbers_and_score_words():
    train, held = T.spelling_sets(200, 30, seed=4, max_number=999)
    again, held_again = T.spelling_sets(200, 30, seed=4, max_number=999)
    assert train.prompts == again.prompts and held.prompts == held_again.prompts
    assert len(train) == 200 and len(held) == 30
    number = lambda prompt: int(next(w.strip(".?") for w in prompt.split() if w.strip(".?").isdigit()))  # noqa: E731
    assert not {number(p) for p in train.prompts} & {number(p) for p in held.prompts}
    assert all(T.number_words(number(p)) == r for p, r in zip(train.prompts, train.responses))
    i = held.answers.index(max(held.answers, key=len))
    assert held.score(i, " " + held.answers[i].upper() + " ") and not held.score(i, held.answers[i] + " one")
    with pytest.raises(ConfigError, match="asrd.spelling_eval"):
        T.spelling_sets(10, 9, seed=0, max_number=9)


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


def test_the_task_sets_are_written_with_a_manifest(tmp_path):
    import json

    train, held = T.spelling_sets(20, 5, seed=0, max_number=99)
    manifest = T.dump({"spelling_train": train, "spelling_eval": held}, tmp_path / "asrd", {"spelling_max": 99})
    rows = [json.loads(line) for line in (tmp_path / "asrd" / "tasks.jsonl").read_text().splitlines()]
    assert len(rows) == 25 and rows[-1]["split"] == "spelling_eval" and rows[0]["response"] == train.responses[0]
    assert manifest["counts"] == {"spelling_train": 20, "spelling_eval": 5} and list(manifest["sha256"]) == ["tasks.jsonl"]
    assert json.loads((tmp_path / "asrd" / "manifest.json").read_text()) == manifest


def test_the_masked_model_takes_its_mlp_width_from_asrd_and_the_rest_from_model():
    """asrd.mlp_ratio sets the comparison model's MLP (4d in the default profile, like Table 2's
    models; its own key, so that Table 2's width can change alone: the memorised tasks need the
    width); depth, width and GELU stay the `model` section's, and the training fingerprint
    records the width it used."""
    import dataclasses

    from tadm import config
    from tadm.asrd.train import TRAIN_KEYS, model_config

    p = config.from_dict(config.render_profile("default"))
    assert p.asrd.mlp_ratio == 4 and "mlp_ratio" in TRAIN_KEYS
    p = config.override(p, {"model.mlp_ratio": 2})  # Table 2's width changed alone
    cfg = model_config(p)
    assert cfg == dataclasses.replace(p.model, mlp_ratio=4)
    q = config.override(p, {"asrd.mlp_ratio": 3})
    assert model_config(q).mlp_ratio == 3 and model_config(q).d_model == p.model.d_model


def test_a_hub_sft_mixture_gets_the_offline_mixtures_arithmetic_problems(tmp_path):
    # the paper profile's SFT mixture (hub) holds no generated arithmetic; asrd's arithmetic task
    # then generates exactly the problems the offline mixture would hold, split the same way
    import dataclasses

    from tadm.asrd.tasks import arithmetic_sets
    from tadm.config import SftConfig
    from tadm.data import sft

    offline = SftConfig(humaneval=False, champ=False, arithmetic_examples=60)
    splits = sft.split_examples(sft.offline_examples(offline, 3), offline.validation_fraction)
    train, held = arithmetic_sets(tmp_path / "no-sft-here", 4, dataclasses.replace(offline, source="hub"), seed=3)
    assert train.prompts == [r["prompt"] for r in splits["train"]]
    assert held.prompts == [r["prompt"] for r in splits["validation"]][:4]
    assert held.answers == [r["answer"] for r in splits["validation"]][:4]
