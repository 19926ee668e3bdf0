"""The committed tree: a file as it is at git HEAD, for the checks that the prose quotes the
committed run (tests/test_docs_figures.py, tests/test_readme_results.py).

`make reproduce` (or `dvc repro` of any stage) rewrites the run's outputs in the working copy, and
an honest rerun moves every timing in them; the README and docs/ quote the committed run. So both
sides of such a check, the prose and the files it quotes, are read from one commit, HEAD: the
checks pass after a rerun as before it, and fail when a commit changes a figure without its prose.
A developer who updates outputs and prose commits them together; a fresh clone's working copy is
HEAD. Outside a git checkout (an unpacked archive, no git, no commit yet), or for a file HEAD does
not track, the working copy is read instead. The tree read is the one this file is in."""

import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> bytes | None:
    """The output of `git <args>` in ROOT, or None when git fails or is missing."""
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


@lru_cache(maxsize=None)
def tracked_at_head() -> frozenset | None:
    """The paths HEAD tracks (relative to ROOT), or None when ROOT is not the top of a git
    checkout with a commit."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top.decode().strip()).resolve() != ROOT.resolve():
        return None
    listing = _git("ls-tree", "-r", "-z", "--full-tree", "--name-only", "HEAD")
    if listing is None:
        return None
    return frozenset(p for p in listing.decode().split("\0") if p)


def where(path: str) -> str:
    """Where `path` is read from: "HEAD" or "the working copy"."""
    tracked = tracked_at_head()
    return "HEAD" if tracked is not None and path in tracked else "the working copy"


@lru_cache(maxsize=None)
def read_bytes(path: str) -> bytes:
    """`path` (relative to ROOT, '/'-separated) as committed at HEAD; the working copy's file
    outside a git checkout or when HEAD does not track it."""
    if where(path) == "HEAD":
        blob = _git("cat-file", "blob", f"HEAD:{path}")
        if blob is not None:
            return blob
    return (ROOT / path).read_bytes()


def read_text(path: str) -> str:
    """`path` as committed at HEAD (see :func:`read_bytes`), decoded as UTF-8 with universal
    newlines, as Path.read_text does."""
    data = read_bytes(path).decode("utf-8")
    return data.replace("\r\n", "\n").replace("\r", "\n")
