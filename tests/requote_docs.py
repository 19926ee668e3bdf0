"""Requote the README and docs/ after a run that moved figures: every figure that
tests/test_docs_figures.py registers is formatted from the committed outputs at git HEAD, so the
prose is rewritten in two steps around the commit of the new outputs.

    python tests/requote_docs.py dump before.json    # the quotes at HEAD (the old outputs)
    git commit metrics paper_figures dvc.lock ...     # the new outputs (prose untouched)
    python tests/requote_docs.py apply before.json   # each moved quote replaced in its document

`apply` replaces, in the working copy, every occurrence of a registered figure's old quote with
its new one, prints one line per replacement, and lists (NOT FOUND) the quotes whose old text is
no longer in its document (already edited by hand, or a sentence to rewrite). What it cannot do:
prose whose words depend on a figure (a direction, "below", a verdict): read the diff, then run
tests/test_docs_figures.py and tests/test_readme_results.py (the README's results block is
paper_figures/claims_summary.md, copied by hand)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quotes() -> dict[tuple[str, str], str]:
    """{(document, what): the quote tests/test_docs_figures.py expects at HEAD}."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    import test_docs_figures

    return {(doc, what): quote() for doc, what, quote in test_docs_figures.FIGURES}


def dump(path: Path) -> None:
    path.write_text(json.dumps([[d, w, q] for (d, w), q in quotes().items()], ensure_ascii=False, indent=0))


def apply(path: Path) -> int:
    """Replace each moved quote; returns the number of quotes not found."""
    old = {(d, w): q for d, w, q in json.loads(path.read_text())}
    missing = 0
    for key, new in quotes().items():
        before = old.get(key)
        if before is None or before == new:
            continue
        doc = ROOT / key[0]
        text = doc.read_text(encoding="utf-8")
        n = text.count(before)
        if not n:
            missing += 1
            print(f"NOT FOUND {key[0]}: {key[1]}: {before!r} -> {new!r}")
            continue
        doc.write_text(text.replace(before, new), encoding="utf-8")
        print(f"{key[0]}: {key[1]}: {before!r} -> {new!r} ({n}x)")
    return missing


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("dump", "apply"):
        print("usage: python tests/requote_docs.py dump|apply FILE.json", file=sys.stderr)
        return 2
    if argv[0] == "dump":
        dump(Path(argv[1]))
        return 0
    return 1 if apply(Path(argv[1])) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
