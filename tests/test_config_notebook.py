"""Notebook parameters are checked like params.yaml keys: papermill's guesses
(`-p K 2.7` a float, `-p K True` a bool, `-p seeds 5` an int, `-p seeds abc` a string) are refused
with the one-line errors of params.yaml instead of truncated, iterated or passed on; a cell's
one-line error is the notebook's error output and the pipeline's papermill prints it and exits 2;
a `profile` parameter is refused unless the params file holds that profile."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tadm import config
from tadm.config import ROOT, notebook
from tadm.errors import ConfigError
from tadm.experiments import table1


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    message = str(e.value)
    assert message and "\n" not in message, message
    return message


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(config.render_profile("default"), sort_keys=False))
    return path


@pytest.mark.parametrize("kwargs,expected", [
    (dict(K=2.7), "notebook parameter: K: expected an integer, got 2.7"),  # before: K = 2
    (dict(K=True), "notebook parameter: K: expected an integer, got True"),  # before: K = 1
    (dict(K="abc"), "notebook parameter: K: expected an integer, got 'abc'"),  # before: a raw ValueError
    (dict(K=0), "notebook parameter: K: must be >= 1, got 0"),
    (dict(eval_examples=2.5), "notebook parameter: eval_examples: expected an integer, got 2.5"),  # before: 2
    (dict(seeds=5), "notebook parameter: seeds: expected a list of an integer, got 5 (papermill: pass a list as YAML"),
    (dict(seeds="abc"), "notebook parameter: seeds: expected a list of an integer, got 'abc'"),  # before: ['a', 'b', 'c']
    (dict(seeds=[0, 0]), "notebook parameter: seeds: must not repeat a value, got [0, 0]"),
    (dict(cache_methods="naive"), "notebook parameter: cache_methods: expected a list of a string, got 'naive'"),
    (dict(replicates=1.5), "notebook parameter: replicates: expected an integer, got 1.5"),
    (dict(precision="fp16"), "notebook parameter: precision: expected one of 'bf16', 'fp32', got 'fp16'"),
    # cross-key checks name the parameter and the key it stands for
    (dict(K=1_000_000_000), "notebook parameter: K (as posttrain.refresh_every): must be <= sample_steps (48"),
    (dict(device="gpu"), "notebook parameter: device (as runtime.device): must be auto, cpu, cuda or cuda:N, got 'gpu'"),
])
def test_table1_parameters_are_refused_in_one_line(params_file, kwargs, expected):
    assert _error(table1.notebook_params, params_file, **kwargs).startswith(expected)


def test_table1_parameters_that_are_meant(params_file):
    p = table1.notebook_params(params_file, "default", K=4, seeds=[5, 0], eval_examples=3, cache_methods=["feature"],
                               replicates=2, device="cpu")
    pt = p.posttrain
    assert (pt.refresh_every, pt.replicate_refresh_every, pt.seeds, pt.eval_examples) == ([4], [], [5, 0], 3)
    assert (pt.cache_methods, pt.replicates, p.runtime.device) == (["feature"], 2, "cpu")
    assert table1.notebook_params(params_file) == config.load(params_file)  # no parameter: the params file as is


def test_a_profile_other_than_the_params_files_is_refused(params_file):
    """Before: `-p profile paper` ran the params file's profile after papermill's warning."""
    assert _error(notebook.load, params_file, "paper").startswith(
        f"notebook parameter: profile: 'paper', but {params_file} holds profile 'default'")
    assert notebook.load(params_file, "default").profile == "default"


@pytest.mark.parametrize("args,expected", [
    (("K_values", 4, "sample.sweep_refresh"), "K_values: expected a list of an integer, got 4"),  # before: TypeError
    (("T", 64.0, "sample.replicate_steps"), "T: expected an integer, got 64.0"),
])
def test_list_and_entry_parameters(args, expected):
    name, value, key = args
    assert expected in _error(notebook.parameter, name, value, key, entry=name == "T")
    assert notebook.parameter("T", 64, "sample.replicate_steps", entry=True) == 64
    assert notebook.parameter("T", 64, "sample.budgets.T") == 64 and notebook.parameter("K", 8, "sample.budgets.K") == 8
    assert "K: must be >= 1, got 0" in _error(notebook.parameter, "K", 0, "sample.budgets.K")
    assert notebook.parameter("K_values", [1, 2], "sample.sweep_refresh") == [1, 2]
    assert notebook.parameter("guidance", 1, "asrd.guidance") == 1.0 and notebook.parameter("K", None, "asrd.refresh_every") is None
    assert "adaptive: must be <= 1.0, got 1.5" in _error(notebook.parameter, "adaptive", 1.5, tp=float, gt=0.0, le=1.0)


# --------------------------------------------------------------------------- through papermill


def _papermill(tmp_path, nb: str, *args: str):
    out = tmp_path / f"out-{nb}"
    env = {**os.environ, "PYTHONPATH": str(config.ROOT)}  # the kernel imports this checkout's tadm
    proc = subprocess.run([sys.executable, "-m", "tadm.papermill_cli", "--no-progress-bar", f"notebooks/{nb}", str(out),
                           *args], capture_output=True, text=True, cwd=config.ROOT, env=env, timeout=300)
    return proc, out


def test_papermill_prints_the_cells_one_line_and_exits_2(tmp_path):
    """Before: `-p K 2.7` ran with K = 2; a bad parameter's error came with papermill's cell traceback."""
    params = config.write_profile("default", tmp_path / "params.yaml")  # not the checkout's (any profile)
    proc, out = _papermill(tmp_path, "table1.ipynb", "-p", "K", "2.7", "-p", "params_file", str(params))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: notebook parameter: K: expected an integer, got 2.7", proc.stderr
    errors = [o for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["traceback"] == [
        "ConfigError: notebook parameter: K: expected an integer, got 2.7"]  # the one line, no traceback


def test_papermill_refuses_a_list_parameter_given_as_a_number(tmp_path):
    """Before: `-p K_values 4` was a raw TypeError in refresh_sweep."""
    params = config.write_profile("default", tmp_path / "params.yaml")  # not the checkout's (any profile)
    proc, _ = _papermill(tmp_path, "refresh_sweep.ipynb", "-p", "K_values", "4", "-p", "params_file", str(params))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: notebook parameter: K_values: expected a list of an integer, got 4"), proc.stderr


def test_papermill_refuses_an_undeclared_parameter(tmp_path):
    """papermill itself warns and runs on (paper_tables has no params_file and no profile parameter)."""
    proc, out = _papermill(tmp_path, "paper_tables.ipynb", "-p", "profile", "paper")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: notebook parameter: profile: the notebook has no such parameter"), proc.stderr
    assert not out.exists()  # refused before the kernel ran anything


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_every_parameter_a_notebook_declares_is_one_papermill_sees(name):
    """papermill's own parser (`papermill --help-notebook`, `inspect_notebook`) reads every assignment
    of the parameters cell; a line it cannot parse (an `=` inside its comment) would leave that
    parameter undeclared and `-p` on it refused."""
    import ast

    from papermill.inspection import inspect_notebook

    cell = next(c for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"]
                if "parameters" in (c.get("metadata", {}).get("tags") or []))
    declared = [t.id for n in ast.parse("".join(cell["source"])).body if isinstance(n, ast.Assign) for t in n.targets]
    assert list(inspect_notebook(str(ROOT / "notebooks" / name))) == declared
