"""Function-level imports only where start-up time needs them, each with a one-line reason.

The rule: an ``import`` inside a function of ``tadm/`` carries the comment ``# lazy: <reason>``
-- trailing on the import's line, or on the line directly above it (a multi-line
``from x import (...)``, or a line that would grow too long) -- and the reason has at least a few
words (what the import costs or what it must wait for, and who needs it). Every other import
belongs at module level.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tadm"
MARK = "# lazy: "
MIN_WORDS = 3


def _reason(line: str) -> str | None:
    at = line.find(MARK)
    return line[at + len(MARK):].strip() if at >= 0 else None


def _has_reason(lines: list[str], lineno: int) -> bool:
    """The import at `lineno` (1-based) has a `# lazy: ` reason on its line or the line above."""
    reason = _reason(lines[lineno - 1])
    above = lines[lineno - 2].strip() if lineno >= 2 else ""
    if reason is None and above.startswith(MARK):
        reason = _reason(above)
    return reason is not None and len(reason.split()) >= MIN_WORDS


def function_level_imports():
    """(path, line number, the file's lines) of every import statement inside a function."""
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines, seen = source.splitlines(), set()
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and sub.lineno not in seen:
                        seen.add(sub.lineno)
                        yield path, sub.lineno, lines


def test_every_function_level_import_gives_its_reason():
    found = list(function_level_imports())
    assert found, f"no function-level import found under {PACKAGE}: is the path right?"
    missing = [f"{path.relative_to(PACKAGE.parent)}:{n}: {lines[n - 1].strip()}"
               for path, n, lines in found if not _has_reason(lines, n)]
    assert not missing, ("function-level imports without a `# lazy: <reason>` comment (move them to module "
                         "level, or say why they wait):\n" + "\n".join(missing))
