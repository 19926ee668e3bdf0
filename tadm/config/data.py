"""The data sections: the pretraining corpus, its tokenizer and packing, the SFT mixture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from tadm.config.fields import spec


@dataclass
class CorpusConfig:
    """Pretraining text: which corpus and how it splits into train / validation."""

    source: Literal["shakespeare", "openwebtext", "local"] = "shakespeare"
    hf_dataset: str = "Skylion007/openwebtext"  # openwebtext: a hub name or a local dataset dir
    hf_split: str = "train"
    local_paths: list[str] = spec([])  # local: files or glob patterns, one document per file
    # MDLM's split: the last `validation_docs` documents validate, the rest train.
    validation_docs: int = spec(100_000, ge=1)
    max_docs: int = spec(0, ge=0)  # 0 = every document


@dataclass
class TokenizerConfig:
    kind: Literal["gpt2", "bpe"] = "gpt2"
    vocab_size: int = spec(50257, ge=260, le=1_000_000)  # bpe only; gpt2 is fixed at 50,257
    min_frequency: int = spec(2, ge=1)


@dataclass
class PackingConfig:
    seq_len: int = spec(1024, ge=8)  # L: each sequence is BOS + (L-2 tokens) + EOS
    shard_sequences: int = spec(65536, ge=1)  # sequences per memory-mapped shard


@dataclass
class HubSftSource:
    """One slice of the paper's SFT mixture, read from the hub (paper profile)."""

    name: str = spec("", nonempty=True)
    dataset: str = spec("", nonempty=True)
    category: Literal["math", "code", "knowledge", "instruction", "stem"] = "math"
    count: int = spec(1, ge=1)
    # optional per entry (the paper profile's entries name only what differs from these)
    config: Optional[str] = spec(None, optional=True)
    split: str = spec("train", optional=True)
    messages_field: str = spec("messages", optional=True)
    # keep only rows whose `reasoning_field` is one of `keep_values` (no-think / reasoning off)
    reasoning_field: Optional[str] = spec("reasoning", optional=True)
    keep_values: list[str] = spec(["off"], optional=True)


@dataclass
class SftConfig:
    """The post-training SFT mixture (paper: 300K no-think examples, 8 canvases each)."""

    source: Literal["offline", "hub"] = "offline"
    tokenizer: str = "project"  # "project" (the tokenizer stage) or a hub/local tokenizer dir
    canvases_per_example: int = spec(8, ge=1)
    canvas_length: int = spec(256, ge=1)
    max_prompt_tokens: int = spec(2048, ge=1)
    max_response_tokens: int = spec(2048, ge=1)
    validation_fraction: float = spec(0.05, ge=0.0, lt=1.0)
    # offline sources (default profile): pip-shipped HumanEval and CHAMP, generated arithmetic
    humaneval: bool = True
    champ: bool = True
    arithmetic_examples: int = spec(2000, ge=0)
    arithmetic_max_operand: int = spec(99, ge=1)
    arithmetic_max_ops: int = spec(3, ge=1)  # operations per problem: 1..max_ops
    arithmetic_ops: list[Literal["+", "-", "*"]] = spec(["+", "-", "*"], nonempty=True, unique=True)
    hub_sources: list[HubSftSource] = spec([])
    # GSM8K for evaluation: null (unused), "hub" (openai/gsm8k) or a directory with
    # train.jsonl / test.jsonl
    gsm8k: Optional[str] = spec(None, path_unless=("hub",))
