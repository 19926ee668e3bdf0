"""File helpers: atomic writes, content hashes, stage manifests.

Every stage output is written to a temporary sibling and renamed into place, so an
interrupted stage never leaves a partial file that looks finished. Manifests hold counts and
SHA-256 hashes of the outputs and no timestamps, so re-running a stage gives identical bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from tadm.errors import DataError

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def sha256_tree(path: str | Path) -> dict[str, str]:
    """Hash of every file under `path` (relative posix path -> sha256), sorted."""
    path = Path(path)
    if path.is_file():
        return {path.name: sha256_file(path)}
    return {
        p.relative_to(path).as_posix(): sha256_file(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it onto `path`.

    Works for files and directories. On error the temporary is removed and any previous
    `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp / path.name
    try:
        yield target
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(target, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, rows) -> int:
    """Write rows (dicts) as JSON lines atomically; return the row count."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def write_manifest(out_dir: str | Path, stage: str, counts: dict, params: dict | None = None,
                   files: list[str | Path] | None = None) -> dict:
    """Write ``<out_dir>/manifest.json``: stage name, counts, params and file hashes.

    `files` defaults to every file under `out_dir`. Paths are stored relative to `out_dir`.
    """
    out_dir = Path(out_dir)
    if files is None:
        hashes = sha256_tree(out_dir)
    else:
        hashes = {Path(f).relative_to(out_dir).as_posix(): sha256_file(f) for f in sorted(map(Path, files))}
    manifest = {"stage": stage, "counts": counts, "params": params or {}, "sha256": hashes}
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def load_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a JSON-lines file; each must be an object holding the `required` keys.

    Blank lines are skipped. Raises DataError naming the file (and line) when the file is
    missing, empty, not JSON, or a row lacks a required key.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in required if k not in row]
            if missing:
                raise DataError(f"{path}:{lineno}: missing field(s) {', '.join(map(repr, missing))}")
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: file holds no rows")
    return rows
