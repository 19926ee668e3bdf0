"""Start-up of a papermill run: `papermill` against `python -m tadm.papermill_cli`, side by side.

Every notebook stage of the pipeline (15 of them) and several tests start papermill. Its CLI
imports nbformat, which imports jsonschema, which compiles the optional rfc3987_syntax's Lark
grammar at import; `tadm.papermill_cli` runs the same CLI with that module marked absent
(`tadm.stage_times` starts the stages' `papermill` commands through it). Each round runs a
one-cell notebook (a parameter and a print: the cost is start-up, kernel included) once each way,
in alternating order, so machine noise hits both alike; the table gives the median seconds and
the median [min-max] of the per-round ratios (papermill / tadm.papermill_cli).

    python benchmarks/papermill_start.py --rounds 5 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

WAYS = {"papermill": ["papermill"], "tadm.papermill_cli": [sys.executable, "-m", "tadm.papermill_cli"]}


def one_cell_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print(x)")]
    nbformat.write(nb, path)


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="write papermill_start.md here")
    args = ap.parse_args()
    seconds = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        nb = Path(tmp) / "in.ipynb"
        one_cell_notebook(nb)
        for r in range(args.rounds):
            order = list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]
            for w in order:
                seconds[w].append(timed([*WAYS[w], "--no-progress-bar", str(nb), str(Path(tmp) / "out.ipynb"),
                                         "-p", "x", "2"]))
    ratios = [a / b for a, b in zip(seconds["papermill"], seconds["tadm.papermill_cli"])]
    lines = ["# papermill start-up (`benchmarks/papermill_start.py`)", "",
             f"{platform.processor() or platform.machine()}, {args.rounds} rounds, a one-cell notebook, "
             "kernel start included; the two ways alternate within each round.", "",
             "| way | median s | min–max s |", "|---|---:|---:|"]
    lines += [f"| `{w}` | {statistics.median(s):.2f} | {min(s):.2f}–{max(s):.2f} |" for w, s in seconds.items()]
    lines += ["", f"papermill / tadm.papermill_cli: median {statistics.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}–{max(ratios):.2f}] over the rounds.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "papermill_start.md").write_text(text)


if __name__ == "__main__":
    main()
