"""Run the paper profile's pipeline end to end on CPU, at toy sizes, offline.

Steps (each printed as it starts), after the transformers version gate of the DiffusionGemma
paths (:func:`version_gate`, recorded in ``dry-run.log``):

1. copy the working tree (tracked and untracked, not ignored files) into ``<workdir>/repo`` and
   commit it to a fresh git repository (DVC needs one);
2. render ``params.yaml``: ``profiles/paper.yaml`` over ``profiles/default.yaml`` as
   ``make profile PROFILE=paper`` would, then the size-only overlay
   ``profiles/dry-run/paper.yaml`` (:func:`render`);
3. build the hub stand-ins into ``<workdir>/hf`` (:mod:`tadm.dryrun.standins`);
4. ``python -m tadm check`` and ``dvc repro`` with ``HF_HOME=<workdir>/hf`` and the hub offline;
5. check that every stage of ``dvc.yaml`` ran and that the paper's tables and figures exist, and
   print a per-stage time table (``metrics/stage_times.json`` of the run).

Exit status 0 when all of it holds; otherwise the failing step's log tail and a non-zero status.
The scratch directory is removed unless ``--keep`` or ``--workdir`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tadm import compat, config
from tadm.errors import DependencyError
from tadm.io import probe_writable

OVERLAY = config.PROFILES_DIR / "dry-run" / "paper.yaml"
# what the pipeline must leave in paper_figures/ (the paper's tables and figures)
FIGURES = ("table2.md", "table2.csv", "table2_runs.md", "table2_compute.md", "table2_throughput.md", "refresh_sweep.md", "tradeoff.png",
           "anchor_staleness.png", "anchor_staleness.md", "table1.md", "table1.csv", "table1_frontier.png", "asrd.md", "asrd.csv",
           "asrd_sweeps.md", "claims.md", "claims.csv", "claims_summary.md", "stage_times.md")


def render() -> dict:
    """The dry run's params: the paper profile with the size-only overlay, validated."""
    raw = config.deep_merge(config.merged_profile("paper"), config.read_yaml(OVERLAY, source=str(OVERLAY)))
    config.from_dict(raw, source=f"profiles/paper.yaml + {OVERLAY.relative_to(config.ROOT)}")
    return raw


def stages() -> list[str]:
    """Every stage name of dvc.yaml, foreach stages expanded by `dvc stage list`."""
    out = subprocess.run([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], cwd=config.ROOT,
                         capture_output=True, text=True, check=True, env=_env(None)).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _env(hf_home: Path | None) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` in dvc.yaml
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DVC_NO_ANALYTICS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_TELEMETRY="1")
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
        for key in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
            env.pop(key, None)  # HF_HOME alone decides where both caches are
    env.pop("PYTHONPATH", None)
    return env


def _copy_tree(dst: Path, resume: bool = False) -> None:
    """The working tree's files into `dst`; on --resume the run's own dvc.lock is kept."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=config.ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        if resume and f == "dvc.lock":
            continue
        src = config.ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def version_gate(log: Path) -> str:
    """The DiffusionGemma paths' transformers gate (tadm.compat), run before anything is copied or
    built: its one line and exit 2 on an older release; otherwise the line recorded in `log`."""
    try:
        installed = compat.require_transformers()
    except DependencyError as e:
        print(f"dry run: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    line = f"transformers {installed} (DiffusionGemma paths need >= {compat.MIN_TRANSFORMERS}): ok"
    with open(log, "a") as out:
        out.write(f"[dry run] version gate: {line}\n")
    return line


def _run(args: list[str], cwd: Path, env: dict, log: Path) -> None:
    """Run `args`, its output to `log` and to the terminal; exit with its tail on failure."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write(line)
        rc = proc.wait()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        sys.exit(f"dry run: {' '.join(args[:4])} failed (exit {rc}); last lines of {log}:\n{tail}")


def _git(repo: Path, env: dict, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def _check_workdir(workdir: Path) -> None:
    """--workdir is a directory the dry run can write (created when absent); otherwise exit with one line."""
    if workdir.exists() and not workdir.is_dir():
        sys.exit(f"--workdir {workdir}: not a directory (the dry run's scratch directory; name a new or an empty one)")
    try:
        probe_writable(workdir)
    except OSError as e:
        sys.exit(f"--workdir {workdir}: cannot create or write it ({e.strerror or e})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tadm.dryrun", description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="scratch directory (kept); default: a temporary one, removed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary scratch directory")
    ap.add_argument("--resume", action="store_true",
                    help="continue in --workdir after a failure: copy the working tree over it and `dvc repro` again "
                         "(finished stages are skipped, interrupted training resumes from its checkpoints)")
    args = ap.parse_args(argv)
    if args.resume and not (args.workdir and (args.workdir / "repo" / ".git").is_dir()):
        sys.exit("--resume: needs --workdir of an earlier dry run (it has no repo/.git)")
    if args.workdir:
        _check_workdir(args.workdir)
    if args.workdir and not args.resume and any(args.workdir.iterdir()):
        sys.exit(f"--workdir {args.workdir}: not empty (the dry run starts from scratch; --resume continues one)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tadm-dry-run-"))
    repo, hf, log = work / "repo", work / "hf", work / "dry-run.log"
    start = time.monotonic()
    try:
        print(f"[dry run] version gate: {version_gate(log)}", flush=True)
        print(f"[dry run] 1/5 copying the working tree to {repo}", flush=True)
        repo.mkdir(parents=True, exist_ok=True)
        _copy_tree(repo, args.resume)
        env = _env(hf)
        env.update(GIT_AUTHOR_NAME="dry-run", GIT_AUTHOR_EMAIL="dry-run@tadm", GIT_COMMITTER_NAME="dry-run",
                   GIT_COMMITTER_EMAIL="dry-run@tadm")
        print("[dry run] 2/5 params.yaml: profiles/paper.yaml + profiles/dry-run/paper.yaml (sizes only)", flush=True)
        raw = render()
        header = config.PARAMS_HEADER.format(name="paper") + f"# + the dry run's size overlay {OVERLAY.relative_to(config.ROOT)}\n"
        (repo / "params.yaml").write_text(header + yaml.safe_dump(raw, sort_keys=False, width=100))
        if not (repo / ".git").is_dir():
            _git(repo, env, "init", "-q")
        _git(repo, env, "add", "-A")
        _git(repo, env, "commit", "-q", "--allow-empty", "-m", "dry run")
        if not (hf / "complete").is_file():
            print(f"[dry run] 3/5 hub stand-ins in their real formats -> {hf}", flush=True)
            from tadm.dryrun import standins  # lazy: the stand-ins import torch (~1.5 s); a resumed run that has them never loads it

            standins.build(hf, config.from_dict(raw, source="dry run"))
            (hf / "complete").write_text("")
        print("[dry run] 4/5 python -m tadm check; dvc repro (HF_HOME = the stand-ins, hub offline)", flush=True)
        _run([sys.executable, "-m", "tadm", "check"], repo, env, log)
        _run([sys.executable, "-m", "dvc", "repro"], repo, env, log)
        print("[dry run] 5/5 checking stages and outputs", flush=True)
        report(repo, log, time.monotonic() - start)
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[dry run] scratch directory kept: {work}")


def report(repo: Path, log: Path, seconds: float) -> None:
    """Every dvc.yaml stage ran, every figure exists; print the stage times."""
    text = log.read_text()
    missing = [s for s in stages() if f"Running stage '{s}'" not in text]
    if missing:
        sys.exit(f"dry run: stage(s) never ran: {', '.join(missing)}")
    absent = [f for f in FIGURES if not (repo / "paper_figures" / f).is_file() or not (repo / "paper_figures" / f).stat().st_size]
    if absent:
        sys.exit(f"dry run: paper_figures/ lacks {', '.join(absent)}")
    times = json.loads((repo / "metrics" / "stage_times.json").read_text())
    rows = times.get("stages", times) if isinstance(times, dict) else {}
    print("\n| stage | seconds |\n|---|---:|")
    for name, rec in rows.items():
        secs = rec.get("seconds", rec) if isinstance(rec, dict) else rec
        print(f"| {name} | {secs} |")
    print(f"\n[dry run] every stage of the paper profile ran; {len(FIGURES)} tables and figures written; "
          f"{seconds / 60:.1f} min in all")


if __name__ == "__main__":
    main()
