"""A rerun of the pipeline on a slower machine, as far as the committed outputs go: every timing
they hold moves (stage seconds and start times, the speed probe, peak memory, the train stage's job
seconds, tokens/s, the measured speed ratios and the claims' throughput cells), every model and
quality figure stays. `make reproduce` does this to the working copy on any machine but the one
that made the committed run.

    python tests/rerun_timings.py [ROOT]   # rewrites ROOT's working copy, prints the paths rewritten

Used by tests/test_docs_after_rerun.py (in a scratch copy) and by .ci/run (in the CI clone, which
puts the files back with git afterwards)."""

import csv
import io
import itertools
import json
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

SLOWER = 1.3          # seconds x 1.3; tokens/s and the probe's GFLOP/s / 1.3
RATIO = 0.93          # a measured speed ratio on the other machine (x 0.93)
SE = 1.1              # its standard error
RSS = 1.03            # peak memory moves a little too
DAYS = 40             # the rerun's day

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _read(path: Path) -> str:
    """The file's text as it is, line endings included."""
    with open(path, newline="") as f:
        return f.read()


def _write(path: Path, text: str) -> None:
    with open(path, "w", newline="") as f:
        f.write(text)


def read_rows(path: Path) -> tuple[list[dict], str]:
    """A CSV file's rows and its line terminator."""
    text = _read(path)
    return list(csv.DictReader(io.StringIO(text, newline=""))), "\r\n" if "\r\n" in text else "\n"


def write_rows(path: Path, rows: list[dict], terminator: str) -> None:
    """Write `rows` back as csv writes them (minimal quoting), lines ended by `terminator`."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator=terminator)
    writer.writeheader()
    writer.writerows(rows)
    _write(path, out.getvalue())


def _like(old: str, value: float) -> str:
    """`value` written as `old` is: its decimals, thousands separators if it had them."""
    decimals = len(old.split(".")[1]) if "." in old else 0
    return f"{value:,.{decimals}f}" if "," in old else f"{value:.{decimals}f}"


def _scale_numbers(cell: str, factor: float, skip=()) -> str:
    """Every number in `cell` times `factor`, in its own format, but those at the indices in `skip`."""
    count = itertools.count()

    def one(m):
        i, old = next(count), m.group(0)
        return old if i in skip else _like(old, float(old.replace(",", "")) * factor)
    return NUMBER.sub(one, cell)


def _ratio_cell(cell: str, skip=()) -> str:
    """A measured speed ratio cell on the slower machine; the reference row (1.00 ± 0.00) stays."""
    nums = NUMBER.findall(cell)
    if not nums or float(nums[0].replace(",", "")) == 1.0:
        return cell
    return _scale_numbers(cell, RATIO, skip)


# --- JSON: by key --------------------------------------------------------------------------------

def _json_value(key: str, value):
    if isinstance(value, dict):
        if key == "seconds":                                   # metrics/train/jobs.json
            return {k: round(v * SLOWER, 1) for k, v in value.items()}
        return {k: _json_value(k, v) for k, v in value.items()}
    if isinstance(value, bool):
        return value
    if key in ("seconds", "total_seconds", "total_minutes") and isinstance(value, (int, float)):
        return round(value * SLOWER, 2)
    if key.startswith("probe_gflops"):
        return ([round(v / SLOWER, 1) for v in value] if isinstance(value, list) else round(value / SLOWER, 1))
    if key.endswith("peak_rss_mib"):
        return round(value * RSS, 1)
    if key == "started":
        return (datetime.fromisoformat(value) + timedelta(days=DAYS)).isoformat(timespec="seconds")
    if key.endswith("tokens_per_s") and isinstance(value, (int, float)):
        return round(value / SLOWER, 4)
    if key.endswith(("_throughput_x", "_speedup_x", "measured_over_bound")) and isinstance(value, (int, float)):
        return value if value == 1.0 else round(value * RATIO, 4)
    return value


def _json(path: Path) -> None:
    _write(path, json.dumps(_json_value("", json.loads(_read(path))), indent=2) + "\n")


# --- CSV: by column ------------------------------------------------------------------------------

CSV_COLUMNS = {
    "tokens_per_s": lambda v: v / SLOWER,
    "throughput_x": lambda v: v if v == 1.0 else v * RATIO,
    "speedup_x": lambda v: v if v == 1.0 else v * RATIO,
    "throughput_se": lambda v: v * SE,
    "speedup_se": lambda v: v * SE,
    "measured_over_bound": lambda v: v if v == 1.0 else v * RATIO,
    "decoder_speedup_x": lambda v: v if v == 1.0 else v * RATIO,
    "decoder_measured_over_bound": lambda v: v if v == 1.0 else v * RATIO,
}


def _csv(path: Path) -> None:
    rows, terminator = read_rows(path)
    for row in rows:
        for col, f in CSV_COLUMNS.items():
            if row.get(col):
                row[col] = repr(f(float(row[col])))
    write_rows(path, rows, terminator)


# --- Markdown tables: by column header -----------------------------------------------------------

def _md_tables(path: Path, columns: dict) -> None:
    """Rewrite the cells of every pipe table whose column header starts with a key of `columns`."""
    lines, out, header = _read(path).split("\n"), [], None
    for line in lines:
        end = "\r" if line.endswith("\r") else ""
        line = line[: len(line) - len(end)]
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        elif not set(line) <= set("|-: "):
            cells = line.strip().strip("|").split("|")
            for j, h in enumerate(header):
                f = next((f for k, f in columns.items() if h.startswith(k)), None)
                if f is not None and j < len(cells):
                    cells[j] = f(cells[j])
            line = "|" + "|".join(cells) + "|"
        out.append(line + end)
    _write(path, "\n".join(out))


# --- the claims' throughput cells ----------------------------------------------------------------

def _slower_text(text: str) -> str:
    """A throughput claim's wording on the slower machine: every 1.23x and measured / FLOP-bound."""
    text = re.sub(r"\d+\.\d+(?=x)", lambda m: _like(m.group(0), float(m.group(0)) * RATIO), text)
    return re.sub(r"(?<=measured / FLOP-bound )\d+\.\d+", lambda m: _like(m.group(0), float(m.group(0)) * RATIO),
                  text)


def _claims(root: Path) -> list[str]:
    path = root / "paper_figures" / "claims.csv"
    rows, terminator = read_rows(path)
    moved = {}
    for row in rows:
        if row["id"].startswith(("throughput", "posttrain_throughput")):
            for col in ("this_run", "notes"):
                new = _slower_text(row[col])
                if new != row[col]:
                    moved[row[col]] = new
                    row[col] = new
            row["value"] = repr((1 + float(row["value"])) * RATIO - 1)
            row["se"] = repr(float(row["se"]) * SE)
    write_rows(path, rows, terminator)
    for name in ("claims.md", "claims_summary.md"):
        md = root / "paper_figures" / name
        text = _read(md)
        for old, new in moved.items():
            text = text.replace(old, new)
        _write(md, text)
    return ["paper_figures/claims.csv", "paper_figures/claims.md", "paper_figures/claims_summary.md"]


def rewrite(root: Path) -> list[str]:
    """Rewrite the timings of `root`'s committed outputs as a slower machine's rerun would; returns
    the paths rewritten (relative to root)."""
    root = Path(root)
    done = []
    for rel in ["metrics/stage_times.json", *sorted(p.relative_to(root).as_posix()
                                                     for p in (root / "metrics" / "stage_times").glob("*.json")),
                "metrics/train/jobs.json", "metrics/table1.json", "metrics/asrd.json"]:
        _json(root / rel)
        done.append(rel)
    for rel in ("paper_figures/table1.csv", "paper_figures/asrd.csv"):
        _csv(root / rel)
        done.append(rel)
    tables = {
        "paper_figures/stage_times.md": {
            "seconds": lambda c: _scale_numbers(c, SLOWER), "minutes": lambda c: _scale_numbers(c, SLOWER),
            "peak RSS": lambda c: _scale_numbers(c, RSS), "probe": lambda c: _scale_numbers(c, 1 / SLOWER)},
        "paper_figures/table2_throughput.md": {
            "tok/s": lambda c: _scale_numbers(c, 1 / SLOWER), "vs ": lambda c: _ratio_cell(c, skip=(2,)),
            "seconds per round": lambda c: _scale_numbers(c, SLOWER)},
        "paper_figures/table1.md": {
            "Tokens/s": lambda c: _scale_numbers(c, 1 / SLOWER), "Throughput": _ratio_cell,
            "measured/bound": _ratio_cell, "decoder speed-up": _ratio_cell},
        "paper_figures/asrd.md": {
            "Tokens/s": lambda c: _scale_numbers(c, 1 / SLOWER), "Speed-up": _ratio_cell},
    }
    for rel, columns in tables.items():
        _md_tables(root / rel, columns)
        done.append(rel)
    done += _claims(root)
    return done


if __name__ == "__main__":
    for rel in rewrite(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])):
        print(rel)
