"""How long each pipeline stage took and how much memory it used, written by the pipeline.

Every ``dvc.yaml`` stage runs its command through ``python -m tadm.stage_times run NAME -- CMD``:
the command runs as a child process (its exit code is passed on unchanged), and on success
``metrics/stage_times/NAME.json`` records its wall time and the peak resident memory of the
largest process it started (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: children and their
descendants once they have been waited for -- papermill's kernel included). A stage DVC does not
rerun keeps the record of the run that made its outputs. A ``papermill ...`` command starts as
``python -m tadm.papermill_cli ...`` (papermill's CLI without an optional import that costs it 3 s).

``python -m tadm.stage_times collect`` (the last stage) gathers the records into
``metrics/stage_times.json`` and the Markdown table ``paper_figures/stage_times.md`` that the
README shows: seconds per stage, their sum, and the largest peak RSS.

Stage times say little without the machine's speed at the time (these machines are shared, and
the same step was measured 1.7x slower an hour apart), so every record also carries a speed
probe taken just before and just after its stage: the median of a few rounds of a fixed
float32 matrix product (`probe`, ~0.1 s, in GFLOP/s). The table shows each stage's probe and
the summary the run's median, so two runs' minutes can be read against their machines.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tadm.errors import DataError, TadmError
from tadm.io import atomic_write_json, atomic_write_text

RECORDS = Path("metrics/stage_times")
SUMMARY = Path("metrics/stage_times.json")
TABLE = Path("paper_figures/stage_times.md")


PROBE_N, PROBE_PRODUCTS, PROBE_ROUNDS = 256, 20, 5


def probe(rounds: int = PROBE_ROUNDS) -> float:
    """The machine's speed now: the median over `rounds` of the GFLOP/s of PROBE_PRODUCTS
    float32 products of two fixed PROBE_N x PROBE_N matrices (the BLAS the stages' matmuls use)."""
    a = np.random.default_rng(0).standard_normal((PROBE_N, PROBE_N), dtype=np.float32)
    flops = PROBE_PRODUCTS * 2 * PROBE_N ** 3
    speeds = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(PROBE_PRODUCTS):
            a @ a
        speeds.append(flops / max(time.perf_counter() - t, 1e-9) / 1e9)
    return float(np.median(speeds))


def lock_dir(records: Path = RECORDS) -> Path:
    """Where a running stage holds its lock: DVC's own scratch folder (.dvc/tmp, not versioned)
    where there is one, else the records folder."""
    scratch = Path(".dvc") / "tmp"
    return scratch if scratch.is_dir() else records


def hold(name: str, records: Path = RECORDS) -> int | None:
    """Take stage `name`'s lock (an exclusive ``flock`` on <lock_dir>/stage-<name>.lock, holding
    this process's pid and start time) and return its descriptor; None when another process holds
    it -- a stage still running, e.g. left behind by a killed ``dvc`` -- after printing one line
    naming it. The stage's command inherits the descriptor, so the lock lasts while either lives."""
    folder = lock_dir(records)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"stage-{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        print(f"error: stage {name} is already running ({holder}; its lock {path}): a killed dvc can leave its "
              "stage running -- wait for it to end or stop it, then rerun", file=sys.stderr)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, started {time.strftime('%Y-%m-%dT%H:%M:%S')}".encode(), 0)
    return fd


def run(name: str, command: list[str], records: Path = RECORDS) -> int:
    """Run `command` under stage `name`'s lock (`hold`: exit 3 at once when the stage is already
    running); on exit code 0 write <records>/<name>.json. Returns the exit code."""
    if not command:
        raise SystemExit("stage_times run: no command given after --")
    fd = hold(name, records)
    if fd is None:
        return 3
    probe_before = probe()
    start, wall = time.time(), time.perf_counter()
    proc = subprocess.run(_launch(command), pass_fds=(fd,))
    os.close(fd)
    seconds = time.perf_counter() - wall
    if proc.returncode == 0:
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        atomic_write_json(records / f"{name}.json", {
            "stage": name, "seconds": round(seconds, 2), "peak_rss_mib": round(peak_kib / 1024, 1),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
            "cpus": os.cpu_count(), "machine": platform.machine(), "command": " ".join(command),
            "probe_gflops": [round(probe_before, 1), round(probe(), 1)],
        })
    return proc.returncode


def _launch(command: list[str]) -> list[str]:
    """`command` as it is started: papermill through `tadm.papermill_cli`, the rest unchanged."""
    if command[0] == "papermill":
        return [sys.executable, "-m", "tadm.papermill_cli", *command[1:]]
    return command


def collect(names: list[str], records: Path = RECORDS, summary: Path = SUMMARY, table: Path = TABLE) -> dict:
    """Gather the records of `names` (every stage, in pipeline order) into one JSON and a table."""
    missing = [n for n in names if not (records / f"{n}.json").is_file()]
    if missing:
        raise DataError(f"{records}: no time record for stage(s) {', '.join(missing)}: run them through "
                        "`python -m tadm.stage_times run NAME -- ...` (dvc.yaml does)")
    rows = [json.loads((records / f"{n}.json").read_text()) for n in names]
    total = sum(r["seconds"] for r in rows)
    peak = max(r["peak_rss_mib"] for r in rows)
    probes = [g for r in rows for g in r.get("probe_gflops", [])]  # records older than the probe have none
    out = {"stages": {r["stage"]: {"seconds": r["seconds"], "peak_rss_mib": r["peak_rss_mib"], "started": r["started"],
                                   "probe_gflops": r.get("probe_gflops")} for r in rows},
           "total_seconds": round(total, 1), "total_minutes": round(total / 60, 1), "max_peak_rss_mib": peak,
           "cpus": rows[0]["cpus"],
           "probe_gflops_median": round(float(np.median(probes)), 1) if probes else None,
           "probe_gflops_range": [min(probes), max(probes)] if probes else None}
    atomic_write_json(summary, out)
    lines = ["# Pipeline stage times", "",
             f"Wall time and peak resident memory of every stage of the last `dvc repro` that ran it "
             f"({rows[0]['cpus']} CPUs). Written by `python -m tadm.stage_times collect`. The probe is the "
             "machine's speed just before / after the stage (GFLOP/s of a fixed float32 matrix product, "
             "`tadm.stage_times.probe`): the same stage takes longer when it is lower.", "",
             "| stage | seconds | minutes | peak RSS (MiB) | probe GFLOP/s |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['stage']} | {r['seconds']:.0f} | {r['seconds'] / 60:.1f} | {r['peak_rss_mib']:.0f} | "
              f"{_probe_cell(r.get('probe_gflops'))} |" for r in rows]
    median = f"{out['probe_gflops_median']:.1f} (median)" if probes else "-"
    lines += [f"| **total** | **{total:.0f}** | **{total / 60:.1f}** | **{peak:.0f}** (max) | {median} |", ""]
    atomic_write_text(table, "\n".join(lines))
    return out


def _probe_cell(probe_gflops: list[float] | None) -> str:
    return " / ".join(f"{g:.1f}" for g in probe_gflops) if probe_gflops else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tadm.stage_times", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one stage's command and record its time and peak memory")
    r.add_argument("name")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the stage's command")
    c = sub.add_parser("collect", help="gather every stage's record into metrics/stage_times.json")
    c.add_argument("names", nargs="+", help="the stages, in pipeline order")
    args = ap.parse_args(argv)
    if args.command == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return run(args.name, cmd)

    try:
        out = collect(args.names)
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{len(out['stages'])} stages, {out['total_minutes']} min, peak RSS {out['max_peak_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
