"""DiffusionGemma's no-think chat rendering: one function for SFT canvases and benchmark prompts."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tadm.config import SftConfig, from_dict, render_profile
from tadm.data import chat, sft
from tadm.errors import ConfigError, DataError

# A Gemma-4-style template written for this test: a thought channel opens only when
# enable_thinking is true, so a rendering without the kwarg set to False would show it.
TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{- '<|turn>' + role + '\n' + m['content'] | trim + '<turn|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}"
    "{%- if enable_thinking | default(true) -%}{{- '<|channel>thought\n' -}}{%- endif -%}{%- endif -%}"
)


def _bpe(special=("<|endoftext|>",)) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["What is 3 + 4?\n3 + 4 = 7\n#### 7", "user model"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture
def project():
    """The default profile's case: a project BPE with no Jinja template."""
    return _bpe()


def test_project_tokenizer_renders_the_gemma4_no_think_turn(project):
    with pytest.raises(DataError, match="no chat template and no <\\|turn> <turn\\|> token"):
        chat.render(project, "x")  # the markers must be added first (sft / dg_base do it)
    n = len(project)
    chat.add_chat_tokens(project)
    assert len(project) == n + 2 and chat.add_chat_tokens(project) is project and len(project) == n + 2
    text = chat.render(project, "  What is 3 + 4?\n")
    assert text == "<|turn>user\nWhat is 3 + 4?<turn|>\n<|turn>model\n"  # no thought channel: thinking off
    ids = chat.encode_prompts(project, ["  What is 3 + 4?\n"])[0]
    assert ids == project(text, add_special_tokens=False)["input_ids"]  # pieces == the whole rendering
    assert project.convert_tokens_to_ids("<|turn>") in ids and ids.count(project.convert_tokens_to_ids("<turn|>")) == 1
    assert chat.response_end(project) == "<turn|>"


def test_a_tokenizer_template_is_rendered_with_thinking_disabled():
    tok = _bpe(("<|endoftext|>", "<|turn>", "<turn|>", "<|channel>"))
    tok.chat_template = TEMPLATE
    tok.bos_token = "<|endoftext|>"
    assert chat.render(tok, "2+2?") == "<|endoftext|><|turn>user\n2+2?<turn|>\n<|turn>model\n"
    assert "thought" in tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True,
                                                tokenize=False)  # the template's default thinks
    assert chat.response_end(tok) == "<turn|>"
    before, after = chat.frame(tok)
    assert chat.encode_prompts(tok, ["2+2?"])[0] == tok(before + "2+2?" + after, add_special_tokens=False)["input_ids"]
    tok.chat_template = "{{ raise_exception('no chat here') }}"
    with pytest.raises(DataError, match="chat template cannot render a user turn: .*no chat here"):
        chat.render(tok, "x")


def test_sft_contexts_and_benchmark_prompts_are_the_same_tokens(project):
    """The SFT canvas's prompt and Table 1's prompt for the same question are identical ids."""
    from tadm.experiments.table1 import Runner

    p = from_dict(render_profile("default"))
    question = "Start with 5. Add 6. What is the result?"
    arrays = sft.to_canvases([{"id": "a-1", "prompt": question, "response": "5 + 6 = 11\n#### 11"}], project,
                             SftConfig(canvas_length=8, max_prompt_tokens=64), seed=0)
    start, p_len, r_len = (int(v) for v in arrays.offsets[0])
    context = arrays.tokens[start: start + p_len].tolist()
    ids, mask = Runner(p, project, []).encode([question])
    assert ids[0].tolist() == context and bool(mask.all())
    assert project.decode(context) == chat.render(project, question)
    response = arrays.tokens[start + p_len: start + p_len + r_len].tolist()
    assert response[-2:] == [project.convert_tokens_to_ids("<turn|>"), project.eos_token_id]


def test_a_prompt_budget_keeps_the_turn_markers(project):
    """A too-long content loses its first tokens, never the markers; a budget the markers alone
    fill is a one-line ConfigError naming the key."""
    chat.add_chat_tokens(project)
    frame = len(chat.encode_prompts(project, [""])[0])
    with pytest.raises(ConfigError, match=f"sft.max_prompt_tokens: {frame} tokens leave no room"):
        chat.encode_prompts(project, ["x"], max_tokens=frame)
    ids = chat.encode_prompts(project, ["word " * 50], max_tokens=30)[0]
    assert len(ids) == 30 and project.decode(ids).startswith("<|turn>user\n") and project.decode(ids).endswith("<|turn>model\n")
