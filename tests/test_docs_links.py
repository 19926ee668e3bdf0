"""Every relative link of the project's Markdown resolves: in each committed *.md file (the README,
docs/, paper_figures/, benchmarks/results/, ...), a link `[text](path)` or `[text](path#anchor)`
(and an image, and a reference definition `[label]: path`) that is not a URL (http(s), mailto, any
other scheme) names a file or folder that exists relative to the linking file (or to the
repository's root, for a path starting with "/"); an anchor into a Markdown file, or a bare
`#anchor` into the linking file itself, is a heading of that file as GitHub slugs it (lowercased,
punctuation other than hyphens and underscores dropped, spaces made hyphens, a repeated heading's
slug suffixed -1, -2, ...) or an explicit `<a name=...>` / `id=...`. Links inside code (fenced
blocks, inline code spans) are text, not links. A generated fragment that a page copies whole
between `<!-- <stem>:begin/end -->` markers (paper_figures/claims_summary.md, in the README) has
links written for that page: they resolve from it. The failure lists every broken link as
`file:line: target`."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]

# folders that hold no project prose: environments, caches, DVC's store, vendored packages
SKIP_DIRS = {".venv", "venv", ".git", ".dvc", ".cache", "node_modules", "__pycache__", ".pytest_cache",
             ".ipynb_checkpoints", "build", "checkpoints", "models"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
INLINE_CODE = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.S)  # a code span ends in its paragraph
# [text](target) or [text](<target>) with an optional title; the text may wrap lines
INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.M)
HTML_ANCHOR = re.compile(r"<a\s[^>]*?(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files() -> list[Path]:
    """The committed *.md files (git ls-files), or every *.md outside SKIP_DIRS without git."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=ROOT, capture_output=True, timeout=60)
        listed = [p for p in proc.stdout.decode().split("\0") if p] if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        listed = None
    if listed is None:
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.md")]
    files = []
    for rel in sorted(set(listed)):
        parts = Path(rel).parts
        if any(part in SKIP_DIRS for part in parts[:-1]):
            continue
        if (ROOT / rel).is_file():  # a file deleted in the working copy links nowhere
            files.append(ROOT / rel)
    return files


def _masked(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (newlines kept, so that
    positions keep their line numbers)."""
    lines, out, fence = text.split("\n"), [], None
    for line in lines:
        m = FENCE.match(line)
        if fence is not None:
            closing = m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
            if closing and not line.strip()[len(m.group(1)):].strip():
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(line)
    body = "\n".join(out)
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text (links as their text, code and
    emphasis marks dropped), lowercased, every character but letters, digits, underscores,
    hyphens and spaces dropped, spaces as hyphens."""
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    s = re.sub(r"<[^>]+>", "", s)                           # inline HTML
    s = s.replace("`", "")
    s = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", s)           # emphasis marks (not a word's underscores)
    s = s.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset:
    """Every anchor a link may name in a Markdown file: its headings' slugs and explicit anchors."""
    text = path.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    found = set(HTML_ANCHOR.findall(text))
    for line in _masked(text).split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link in a Markdown file, code excluded."""
    body = _masked(path.read_text(encoding="utf-8"))
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEF):
        for m in pattern.finditer(body):
            target = m.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            found.append((body.count("\n", 0, m.start(1)) + 1, target.strip()))
    return sorted(found)


def copied_into(path: Path, files: list[Path]) -> Path | None:
    """The page a generated fragment is written for: the Markdown file that holds `path`'s whole
    text between `<!-- <stem>:begin -->` and `<!-- <stem>:end -->` (the README's claims block
    holds paper_figures/claims_summary.md so), or None. A fragment's relative links are written
    for that page and resolve from there."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(rf"<!-- {re.escape(path.stem)}:begin -->\n(.*?)<!-- {re.escape(path.stem)}:end -->", re.S)
    for page in files:
        if page != path:
            m = pattern.search(page.read_text(encoding="utf-8"))
            if m and m.group(1) == text:
                return page
    return None


def broken(path: Path, target: str, base: Path | None = None) -> bool:
    """Whether a link target in `path` fails to resolve (a URL never does here); `base`: the file
    relative links resolve from (`path` itself unless `path` is a fragment copied into it)."""
    base = base or path
    if not target or SCHEME.match(target) or target.startswith("//"):
        return False
    file_part, _, anchor = target.partition("#")
    file_part = unquote(file_part.split("?", 1)[0])
    if file_part:
        dest = (ROOT / file_part.lstrip("/")) if file_part.startswith("/") else (base.parent / file_part)
        if not dest.exists():
            return True
    else:
        dest = base
    if anchor and dest.is_file() and dest.suffix.lower() == ".md":
        return unquote(anchor).lower() not in anchors(dest.resolve())
    return False


def test_every_relative_link_resolves():
    files = markdown_files()
    assert any(f.name == "README.md" and f.parent == ROOT for f in files), "README.md is not among the files read"
    bad = []
    for f in files:
        base = copied_into(f, files) or f
        bad += [f"{f.relative_to(ROOT).as_posix()}:{line}: {target}"
                for line, target in links(f) if broken(f, target, base)]
    assert not bad, f"{len(bad)} broken relative link(s) in the Markdown files:\n" + "\n".join(bad)


# --- the checker itself ----------------------------------------------------------------------

def test_slugs_follow_githubs_rule():
    assert slug("Two commands") == "two-commands"
    assert slug("The test suite's time") == "the-test-suites-time"
    assert slug("2026-12-04: training-free caches (design before the code)") == \
        "2026-12-04-training-free-caches-design-before-the-code"
    assert slug("`make reproduce`, step by step") == "make-reproduce-step-by-step"
    assert slug("TADM‡ against [ReMDM](x.md)") == "tadm-against-remdm"
    assert slug("The default → paper mapping") == "the-default--paper-mapping"
    assert slug("runtime.nproc and snake_case") == "runtimenproc-and-snake_case"


def test_the_checker_finds_what_is_broken_and_only_that(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some section\n\n## Some section\n")
    page = tmp_path / "README.md"
    page.write_text(
        "See [a](docs/a.md), [its section](docs/a.md#some-section), [again](docs/a.md#some-section-1),\n"
        "[the folder](docs/), [a URL](https://example.com/x.md), [mail](mailto:x@y.z), [top](#top).\n"
        "# Top\n"
        "Broken: [gone](docs/b.md), [no such section](docs/a.md#nowhere),\n"
        "[wrapped\ntext](docs/c.md), ![image](img.png) and [here](#nowhere).\n"
        "`[code](not/a/link.md)`\n"
        "```\n[fenced](not/a/link.md)\n```\n"
        "[ref]: docs/missing.md\n")
    anchors.cache_clear()
    got = [(line, t) for line, t in links(page) if broken(page, t)]
    anchors.cache_clear()
    assert got == [(4, "docs/a.md#nowhere"), (4, "docs/b.md"), (6, "#nowhere"), (6, "docs/c.md"),
                   (6, "img.png"), (11, "docs/missing.md")], got


def test_a_copied_fragment_resolves_from_the_page_that_copies_it(tmp_path):
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "claims.md").write_text("# Claims\n")
    fragment = tmp_path / "figs" / "summary.md"
    fragment.write_text("See [claims](figs/claims.md).\n")
    page = tmp_path / "README.md"
    page.write_text("<!-- summary:begin -->\nSee [claims](figs/claims.md).\n<!-- summary:end -->\n")
    assert copied_into(fragment, [page, fragment]) == page
    assert not broken(fragment, "figs/claims.md", page) and broken(fragment, "figs/claims.md")
    page.write_text("<!-- summary:begin -->\nSomething else.\n<!-- summary:end -->\n")
    assert copied_into(fragment, [page, fragment]) is None  # not a copy: its own links resolve from itself


def test_a_stray_backtick_hides_no_link_past_its_paragraph(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("A stray ` backtick.\n\nThen [a link](missing.md) and `code`.\n")
    assert links(page) == [(3, "missing.md")]
