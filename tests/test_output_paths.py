"""No write removes what the caller did not create (issue 56): every output path of the command
line (`python -m tadm`, `python -m tadm.harness`) and of the notebooks that names an existing
folder where a file is written, an existing file where a folder is, or a folder that is replaced
as a whole and holds what its writer does not write, is refused in one line (exit 2) before any
work, the folder and its files untouched.

Before: `python -m tadm --params DIR profile micro` turned a folder holding important.txt into a
params file, exit 0; so did `compute-column --metrics DIR`, `throughput --table DIR` and the
table1 notebook's `-p metrics_path DIR` (after the whole Table 1 run)."""

import json
import os
import subprocess
import sys

import pytest

from tadm import config
from tadm.errors import ConfigError

ROOT = config.ROOT
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # subprocesses import this checkout's tadm


@pytest.fixture
def folder(tmp_path):
    """A folder the command did not make, holding a file of someone's."""
    path = tmp_path / "folder"
    path.mkdir()
    (path / "important.txt").write_text("keep me")
    return path


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    return path


def _untouched(folder):
    assert folder.is_dir() and [p.name for p in folder.iterdir()] == ["important.txt"]
    assert (folder / "important.txt").read_text() == "keep me"


def _run(module, *args, cwd):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=300)


def _refused(proc, prefix: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), proc.stderr
    return lines[0]


# --------------------------------------------------------------------------- python -m tadm: a file flag at a folder

FILE_FLAGS = [  # (command line with {} for the path, the flag, the command)
    (["--params", "{}", "profile", "micro"], "--params", "profile"),
    (["compute-column", "--metrics", "{}"], "--metrics", "compute-column"),
    (["throughput", "--out", "{}"], "--out", "throughput"),
    (["throughput", "--table", "{}"], "--table", "throughput"),
]


@pytest.mark.parametrize("argv,flag,command", FILE_FLAGS, ids=[f"{c} {f}" for _, f, c in FILE_FLAGS])
def test_a_file_flag_naming_a_folder_is_refused(folder, tmp_path, argv, flag, command):
    proc = _run("tadm", *[a.replace("{}", str(folder)) for a in argv], cwd=tmp_path)
    _refused(proc, f"error: python -m tadm {command}: {flag}: {folder} is an existing folder (holding important.txt), "
                   "where a file is to be written")
    _untouched(folder)


def test_compute_columns_files_under_out_are_checked_too(folder, tmp_path):
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "table2_compute.md").mkdir()
    proc = _run("tadm", "compute-column", "--out", str(tmp_path / "figs"), cwd=tmp_path)
    _refused(proc, f"error: python -m tadm compute-column: --out: {tmp_path / 'figs' / 'table2_compute.md'} is an "
                   "existing folder (empty)")


# --------------------------------------------------------------------------- python -m tadm: a folder flag at a file

DIR_FLAGS = ["corpus", "tokenizer", "pack", "sft", "compute-column", "claims"]


@pytest.mark.parametrize("command", DIR_FLAGS)
def test_a_folder_flag_naming_a_file_is_refused(afile, tmp_path, command):
    proc = _run("tadm", "--params", str(ROOT / "params.yaml"), command, "--out", str(afile), cwd=tmp_path)
    _refused(proc, f"error: python -m tadm {command}: --out: {afile} is an existing file, where a folder is to be written")
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("sub", ["", "train"])
def test_a_folder_replaced_whole_is_refused_when_it_holds_another_file(tmp_path, sub):
    """`tokenizer --out` replaces its folder, `pack --out` its split folders: only their own previous output."""
    command = "pack" if sub else "tokenizer"
    out = tmp_path / "out"
    folder = out / sub if sub else out
    folder.mkdir(parents=True)
    (folder / "important.txt").write_text("keep me")
    proc = _run("tadm", "--params", str(ROOT / "params.yaml"), command, "--out", str(out), cwd=tmp_path)
    _refused(proc, f"error: python -m tadm {command}: --out: {folder} is an existing folder holding important.txt, "
                   "which this output does not write")
    _untouched(folder)


# --------------------------------------------------------------------------- python -m tadm.harness --output_path


@pytest.mark.parametrize("form", ["--output_path", "-o", "--output_path="])
def test_the_harness_output_path(folder, afile, tmp_path, form):
    """lm-eval writes <stem>_<date>.json beside a path ending in .json and folders under any other."""
    def argv(path):
        return [f"{form}{path}"] if form.endswith("=") else [form, str(path)]

    proc = _run("tadm.harness", "--model", "tadm", "--tasks", "tadm_arithmetic", *argv(afile), cwd=tmp_path)
    _refused(proc, f"error: tadm.harness: --output_path: {afile} is an existing file, where a folder is to be written")
    assert afile.read_text() == "keep me"
    results = folder / "results.json"
    results.mkdir()
    (results / "important.txt").write_text("keep me")
    proc = _run("tadm.harness", "--model", "tadm", "--tasks", "tadm_arithmetic", *argv(results), cwd=tmp_path)
    _refused(proc, f"error: tadm.harness: --output_path: {results} is an existing folder (holding important.txt)")
    _untouched(results)


def test_the_harness_finds_every_spelling_of_output_path():
    from tadm.harness import output_path_arg

    assert output_path_arg(["--tasks", "x"]) is None
    assert output_path_arg(["--output_path", "a", "-o", "b"]) == "b"
    assert output_path_arg(["--output_path=a/b.json"]) == "a/b.json"
    assert output_path_arg(["-oout", "--tasks", "x"]) == "out"


# --------------------------------------------------------------------------- notebook output parameters

NOTEBOOK_OUTPUTS = [  # (notebook, parameter, what it names)
    ("anchor_staleness", "out_dir", "dir"),
    ("asrd", "root", "dir"), ("asrd", "results_path", "file"), ("asrd", "out_dir", "dir"), ("asrd", "metrics_path", "file"),
    ("paper_tables", "out_dir", "dir"), ("paper_tables", "metrics_file", "file"),
    ("refresh_sweep", "samples_dir", "dir"), ("refresh_sweep", "results_dir", "dir"),
    ("sample", "samples_dir", "dir"), ("sample", "out", "file"),
    ("table1", "root", "dir"), ("table1", "results_path", "file"), ("table1", "out_dir", "dir"),
    ("table1", "metrics_path", "file"),
    ("train", "root", "dir"),
]


def _checks_of(name: str) -> tuple[str, str]:
    """The notebook's parameters cell, and its first code cell up to and including its last
    output check (``check_output_paths(...)`` / ``notebook.check_outputs(...)``; the imports and
    one_line_errors before it)."""
    import ast

    cells = [c for c in json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"] if c["cell_type"] == "code"]
    params = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    source = "".join(cells[cells.index(params) + 1]["source"])
    checks = [node for node in ast.parse(source).body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and ast.unparse(node.value.func) in ("check_output_paths", "notebook.check_outputs")]
    assert checks, f"notebooks/{name}.ipynb checks no output parameter before its work"
    return "".join(params["source"]), "".join(source.splitlines(keepends=True)[:checks[-1].end_lineno])


@pytest.mark.parametrize("name,parameter,kind", NOTEBOOK_OUTPUTS, ids=[f"{n} {p}" for n, p, _ in NOTEBOOK_OUTPUTS])
def test_a_notebook_output_parameter_over_what_is_there_is_refused(folder, afile, name, parameter, kind):
    """The notebook's own statements (its parameters, then its check before any work) run with the
    parameter at a folder (a file parameter) or a file (a folder parameter)."""
    params, checks = _checks_of(name)
    at = folder if kind == "file" else afile
    namespace: dict = {}
    exec(params, namespace)
    assert parameter in namespace, f"notebooks/{name}.ipynb has no parameter {parameter}"
    namespace[parameter] = str(at)
    with pytest.raises(ConfigError) as e:
        exec(checks, namespace)
    message = str(e.value)
    assert "\n" not in message
    what = ("an existing folder (holding important.txt), where a file is to be written" if kind == "file"
            else "an existing file, where a folder is to be written")
    assert message.startswith(f"notebook parameter: {parameter}: {at} is {what}") and "refused" in message, message
    if kind == "file":
        _untouched(folder)
    else:
        assert afile.read_text() == "keep me"


def test_every_notebook_default_output_passes_its_check(tmp_path):
    """The defaults (relative to an empty working directory) are accepted."""
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for name in sorted({n for n, _, _ in NOTEBOOK_OUTPUTS}):
            params, checks = _checks_of(name)
            namespace: dict = {}
            exec(params, namespace)
            exec(checks, namespace)
    finally:
        os.chdir(cwd)


def test_table1_notebook_metrics_path_at_a_folder_is_refused_before_the_run(folder, tmp_path):
    """The reported case, through the pipeline's papermill: refused in the first code cell."""
    out = tmp_path / "out.ipynb"
    proc = subprocess.run([sys.executable, "-m", "tadm.papermill_cli", "--no-progress-bar", "notebooks/table1.ipynb",
                           str(out), "-p", "metrics_path", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: notebook parameter: metrics_path: {folder} is an existing folder (holding important.txt)"), proc.stderr
    _untouched(folder)
