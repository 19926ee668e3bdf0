"""The README's two commands in the order a newcomer runs them: `make test` passes after `make
reproduce`. A rerun rewrites the committed outputs in the working copy, every model and quality
figure identical, every timing moved (a different machine, or the same one on another day); the
checks that the README and docs/ quote the committed run read the prose and its sources as committed
at git HEAD (tests/committed.py), so they pass after the rerun and still fail on a commit that moves
a figure without its prose.

In a scratch git repository holding HEAD's files (and the working copy's versions of these checks),
tests/rerun_timings.py rewrites the timings as a rerun on a slower machine would, without a commit:
the two docs test files pass there. The same timings committed without the prose fail them (the
rewrite reaches what the prose quotes), and so does a quality figure or a verdict committed
without the prose, the rerun's timings beside it in the working copy."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import committed
import rerun_timings

ROOT = committed.ROOT
CHECKS = ("tests/test_docs_figures.py", "tests/test_readme_results.py")
# the checks as they are in the working copy (the mechanism under test), beside HEAD's files
OVERLAY = (*CHECKS, "tests/committed.py", "tests/conftest.py")
GIT = ("git", "-c", "user.name=TADM tests", "-c", "user.email=tests@tadm.local", "-c", "commit.gpgsign=false",
       "-c", "core.hooksPath=/dev/null")


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run([*GIT, *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)} failed in {repo}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def committed_tree(tmp_path_factory) -> Path:
    """A git repository whose one commit holds HEAD's files, with the working copy's docs checks."""
    if committed.tracked_at_head() is None:
        pytest.skip("needs a git checkout with a commit (the checks read HEAD there)")
    dst = tmp_path_factory.mktemp("committed") / "repo"
    dst.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        try:
            tar.extractall(dst, filter="data")
        except TypeError:  # a Python without extraction filters
            tar.extractall(dst)
    for rel in OVERLAY:
        if (ROOT / rel).is_file():
            shutil.copy2(ROOT / rel, dst / rel)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-q", "-m", "the committed run")
    return dst


@pytest.fixture
def repo(committed_tree, tmp_path) -> Path:
    """A fresh copy of the committed tree (and its repository) for one test."""
    return Path(shutil.copytree(committed_tree, tmp_path / "repo", symlinks=True))


def docs_checks(repo: Path) -> tuple[int, list[str], str]:
    """Run the two docs test files in `repo`: exit status, the ids of the failed tests, the output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    # without the plugins these two files do not use (nbmake's import alone takes seconds)
    quiet = [arg for plugin in ("cacheprovider", "nbmake", "hydra_pytest", "anyio") for arg in ("-p", f"no:{plugin}")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", *quiet, *CHECKS],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    failed = [m.group(1) for m in re.finditer(r"^FAILED (\S+?\.py::.*?)(?: - .*)?$", out, re.M)]
    return proc.returncode, failed, out


def test_the_docs_checks_pass_after_a_rerun_that_moved_every_timing(repo):
    rewritten = rerun_timings.rewrite(repo)
    changed = set(git(repo, "diff", "--name-only").split())
    assert set(rewritten) == changed, (rewritten, changed)
    rc, failed, out = docs_checks(repo)
    assert rc == 0 and not failed, f"the docs checks fail after a rerun's timings (uncommitted):\n{out[-6000:]}"


def test_the_rerun_timings_committed_without_the_prose_fail_the_docs_checks(repo):
    """The rewrite reaches what the prose quotes: committed, it fails the checks (the rerun's
    timings are not the run the prose quotes until the prose is updated with them)."""
    rerun_timings.rewrite(repo)
    git(repo, "commit", "-q", "-am", "a rerun's timings without the prose")
    rc, failed, out = docs_checks(repo)
    assert rc == 1, out[-6000:]
    docs = [f for f in failed if f.startswith(CHECKS[0])]
    assert any(f.startswith(CHECKS[1]) for f in failed), f"the README's results block passed:\n{out[-6000:]}"
    for what in ("README.md: the run's stage time", "the train stage's job pool",
                 "TADM's throughput against ADLM", "the speed of each Table 1 family", "ASRD's speed"):
        assert any(what in f for f in docs), f"{what!r} passed with the rerun's timings committed:\n{failed}"
    assert len(docs) >= 12, failed


def _table2_mauve(repo: Path) -> str:
    """The fusion's ablation's MAUVE at T = 64 (metrics/table2.json) moved."""
    path = repo / "metrics" / "table2.json"
    table = json.loads(path.read_text())
    table["tadm_nofusion_T64_mauve"] = round(table["tadm_nofusion_T64_mauve"] + 0.05, 4)
    path.write_text(json.dumps(table, indent=2) + "\n")
    return "metrics/table2.json"


def _summary_verdict(repo: Path) -> str:
    """A claim's verdict in the claims summary the README copies (TADM‡'s MAUVE against ReMDM),
    moved to another verdict."""
    path = repo / "paper_figures" / "claims_summary.md"
    lines = path.read_text().split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith("| TADM‡ MAUVE above ReMDM's"))
    head, verdict, _ = lines[i].rsplit("|", 2)
    lines[i] = f"{head}| {'contradicted' if verdict.strip() != 'contradicted' else 'inconclusive'} |"
    path.write_text("\n".join(lines))
    return "paper_figures/claims_summary.md"


def _claims_verdict(repo: Path) -> str:
    """A claim's verdict in paper_figures/claims.csv (TADM:Post-train's accuracy against its
    base), moved to "contradicted" (a verdict the docs count)."""
    path = repo / "paper_figures" / "claims.csv"
    rows, terminator = rerun_timings.read_rows(path)
    row = next(r for r in rows if r["id"] == "posttrain_accuracy_vs_base")
    assert row["verdict"] != "contradicted", row["verdict"]
    row["verdict"] = "contradicted"
    rerun_timings.write_rows(path, rows, terminator)
    return "paper_figures/claims.csv"


@pytest.mark.parametrize("change, fails", [
    (_table2_mauve, "test_docs_figures.py::test_a_quoted_figure_equals_the_committed_run"
                    "[docs/default-profile.md: the fusion's ablation in Table 2]"),
    (_summary_verdict, "test_readme_results.py::test_the_readme_results_table_is_the_committed_claims_summary"),
    (_claims_verdict, "test_docs_figures.py::test_a_quoted_figure_equals_the_committed_run"
                      "[docs/default-profile.md: the findings' verdicts]"),
], ids=["a MAUVE value", "a verdict in the README's summary", "a verdict in claims.csv"])
def test_a_quality_figure_or_verdict_committed_without_the_prose_fails(repo, change, fails):
    """Reading HEAD weakens nothing: a moved quality figure or verdict, committed, fails its check
    exactly, the rerun's timings beside it in the working copy."""
    path = change(repo)
    git(repo, "commit", "-q", "-m", f"{path} without the prose", "--", path)
    rerun_timings.rewrite(repo)
    rc, failed, out = docs_checks(repo)
    assert rc == 1 and any(f.endswith(fails) for f in failed), f"{fails} passed:\n{out[-6000:]}"
    assert all(f.endswith(fails) for f in failed), f"more failed than {fails}:\n{failed}"
