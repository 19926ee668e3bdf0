"""The code part of a training run's identity: what the program does, not how its text reads.

A checkpoint resumes (or counts as finished) only under the code it was trained by. Each run
names the sources its trajectory depends on (files or folders of `tadm`, relative to the
package); :func:`code_fingerprint` hashes each file's syntax tree with its docstrings dropped and
without positions, so a comment, a docstring, a blank line or a re-wrapped line leaves a
finished run finished, and any change of what the code does (a statement, a name, a constant,
an error message) makes it stale. Modules that only read and write what training produced
(:data:`NOT_OBJECTIVE`) are left out of every run's sources.

    code_fingerprint(("train/trainer.py", "methods", "models"))   # 64 hex digits
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Iterable

PACKAGE = Path(__file__).resolve().parent.parent
# read and write checkpoints without shaping what is trained: a change never makes a run stale
NOT_OBJECTIVE = ("models/io.py", "models/loading.py")


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def program_text(path: Path) -> str:
    """The syntax tree of the Python file at `path` without docstrings or positions, as text."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return ast.dump(_without_docstrings(tree), annotate_fields=True, include_attributes=False)


def source_files(sources: Iterable[str], root: Path = PACKAGE) -> list[Path]:
    """The .py files of `sources` (files or folders relative to `root`), sorted, less NOT_OBJECTIVE."""
    skip = {(root / s).resolve() for s in NOT_OBJECTIVE}
    files = set()
    for source in sources:
        path = root / source
        if not path.exists():
            raise FileNotFoundError(f"code fingerprint: {path} does not exist")
        files.update([path] if path.is_file() else path.rglob("*.py"))
    return sorted(f for f in files if f.resolve() not in skip)


def code_fingerprint(sources: Iterable[str], root: Path = PACKAGE) -> str:
    """sha256 over the files of `sources`: each one's path relative to `root` and its program text."""
    digest = hashlib.sha256()
    for path in source_files(sources, root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + program_text(path).encode() + b"\0")
    return digest.hexdigest()


__all__ = ["NOT_OBJECTIVE", "code_fingerprint", "program_text", "source_files"]
