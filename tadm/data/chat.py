"""DiffusionGemma's chat format in no-think mode: one rendering for SFT canvases and benchmarks.

The paper post-trains and evaluates in no-think mode (App. C.1, Sec. 6.1): every SFT prompt and
every benchmark prompt is one user turn of DiffusionGemma's chat template, rendered with
thinking disabled and ending in the model's generation prompt. Two sources of that rendering:

* a tokenizer that carries a chat template (the paper profile: DiffusionGemma's own, loaded by
  transformers): ``apply_chat_template([user], add_generation_prompt=True,
  enable_thinking=False, tokenize=False)``. ``enable_thinking`` is the switch Gemma-4-family
  templates read; a template that does not mention it renders as if it were not passed
  (transformers hands template kwargs to Jinja, unknown names are simply unused).
* the project's BPE (default profile; no Jinja template): :data:`USER_PREFIX` + text +
  :data:`GENERATION_PROMPT`, the Gemma-4 turn layout DiffusionGemma uses,
  ``<|turn>user\\n{text}<turn|>\\n<|turn>model\\n``. With thinking disabled the
  generation prompt opens no thought channel (DiffusionGemma's non-thinking template emits no
  empty ``<|channel>thought\\n<channel|>`` block). ``<|turn>`` and ``<turn|>`` are added to the
  project tokenizer as special tokens (:func:`add_chat_tokens`, ids 300 and 301 of the 300-token
  BPE), so each marker costs one token; "user", "model" and the newlines are ordinary text.

A hub tokenizer with no template whose vocabulary already holds the two markers (DiffusionGemma's,
should its template ship only with the processor) gets the project rendering as is, without
Gemma's leading ``<bos>``.

Both paths go through :func:`frame` (the text before and after the user's content, found by
rendering a sentinel) and :func:`encode_prompts`, so the SFT contexts and the benchmark prompts
are tokenized by the same function and cannot drift apart. Responses end with the template's
end-of-turn marker (:func:`response_end`), then the tokenizer's EOS.
"""

from __future__ import annotations

from typing import Sequence

from tadm.errors import ConfigError, DataError

TURN_START, TURN_END = "<|turn>", "<turn|>"
CHAT_TOKENS = (TURN_START, TURN_END)
USER_PREFIX = f"{TURN_START}user\n"
GENERATION_PROMPT = f"{TURN_END}\n{TURN_START}model\n"  # closes the user turn, opens the model's
_SENTINEL = "\x00TADM-CONTENT\x00"


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def add_chat_tokens(tokenizer):
    """Add the chat markers to `tokenizer` as special tokens, in place (a no-op when it has a
    chat template of its own or knows the markers already); returns it. The SFT stage and the
    base's training call it, and the base's directory saves the tokenizer with them."""
    if has_template(tokenizer):
        return tokenizer
    vocab = tokenizer.get_vocab()
    missing = [t for t in CHAT_TOKENS if t not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    return tokenizer


def _render_template(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                             enable_thinking=False, tokenize=False)
    except Exception as e:  # jinja errors of a hub template: one line, not a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"the tokenizer's chat template cannot render a user turn: {first}") from None


def _split(text: str, what: str) -> tuple[str, str]:
    if text.count(_SENTINEL) != 1:
        raise DataError(f"the tokenizer's chat template does not keep the {what} verbatim (once); cannot frame prompts")
    before, after = text.split(_SENTINEL)
    return before, after


def frame(tokenizer) -> tuple[str, str]:
    """(text before, text after) a user's content in the no-think rendering with generation prompt."""
    if has_template(tokenizer):
        return _split(_render_template(tokenizer, [{"role": "user", "content": _SENTINEL}], True), "user content")
    vocab = tokenizer.get_vocab()
    missing = [t for t in CHAT_TOKENS if t not in vocab]
    if missing:
        raise DataError(f"tokenizer has no chat template and no {' '.join(missing)} token: it was not loaded for "
                        "post-training (tadm.data.chat.add_chat_tokens); rerun dvc repro sft dg_base")
    return USER_PREFIX, GENERATION_PROMPT


def render(tokenizer, text: str) -> str:
    """One user turn holding `text` (stripped, as Gemma templates trim content), thinking off,
    followed by the model's generation prompt."""
    before, after = frame(tokenizer)
    return before + text.strip() + after


def response_end(tokenizer) -> str:
    """The text that closes the model's turn after its response (``<turn|>`` for Gemma 4)."""
    if not has_template(tokenizer):
        return TURN_END
    text = _render_template(tokenizer, [{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": _SENTINEL}], False)
    return _split(text, "assistant content")[1].rstrip("\n")


def _ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []


def encode_prompts(tokenizer, texts: Sequence[str], max_tokens: int = 0, key: str = "sft.max_prompt_tokens") -> list[list[int]]:
    """Token ids of each text rendered as a no-think user turn plus generation prompt.

    The frame and the content are tokenized apart (the markers are special tokens, so this is
    what tokenizing the whole rendering gives) and, when `max_tokens` > 0, the content keeps
    its last tokens so that the whole prompt fits -- the turn markers are never cut. A budget
    the frame alone fills is a ConfigError naming `key`."""
    before, after = frame(tokenizer)
    pre, post = _ids(tokenizer, [before, after])
    budget = max_tokens - len(pre) - len(post)
    if max_tokens and budget < 1:
        raise ConfigError(key, f"{max_tokens} tokens leave no room for a prompt inside the chat template's "
                               f"{len(pre) + len(post)} tokens of turn markers")
    contents = _ids(tokenizer, [t.strip() for t in texts])
    return [pre + (c[len(c) - budget:] if max_tokens and len(c) > budget else c) + post for c in contents]
