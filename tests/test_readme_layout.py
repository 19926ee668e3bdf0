"""The README's Layout names every module of the package under its own package's line."""

from __future__ import annotations

import re

from tadm.config import ROOT


def layout_blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):text.index("## Status")]
    blocks: dict[str, str] = {}
    current: str | None = None
    for line in layout.splitlines():
        m = re.match(r"^(tadm/|  (\w+)/)\s", line)
        if m:
            current = m.group(2) or "tadm"
        elif re.match(r"^\S", line):
            current = None
        if current:
            blocks[current] = blocks.get(current, "") + line + "\n"
    return blocks


def test_the_layout_lists_every_module():
    blocks = layout_blocks()
    missing = []
    for path in sorted((ROOT / "tadm").rglob("*.py")):
        if path.name.startswith("_"):
            continue  # __init__, __main__ and private helpers
        parts = path.relative_to(ROOT / "tadm").parts
        package = "tadm" if len(parts) == 1 else parts[0]
        name = parts[1] if len(parts) > 2 else path.stem  # a subpackage is listed by its name
        if not re.search(rf"\b{re.escape(name)}\b", blocks.get(package, "")):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"README Layout does not name: {', '.join(missing)}"
