"""A notebook run by hand never writes over the pipeline's outputs: every output parameter's default
lies outside them, a path over one is refused in one line before any work, and a ``dvc repro``
stage (DVC_STAGE set) writes its own outputs."""

import ast
import json
import subprocess
import sys

import pytest

from tadm.config import ROOT, notebook
from tadm.errors import ConfigError

from tests.test_output_paths import NOTEBOOK_OUTPUTS

# Table 1's and ASRD's `root` is where they read the models (checked only against what is there)
READ_ROOTS = {("table1", "root"), ("asrd", "root")}
OUTPUTS: dict[str, dict[str, str]] = {}
for _name, _param, _kind in NOTEBOOK_OUTPUTS:
    if (_name, _param) not in READ_ROOTS:
        OUTPUTS.setdefault(_name, {})[_param] = _kind


def defaults(name: str) -> dict:
    """The parameters cell of notebooks/<name>.ipynb as {parameter: default}."""
    cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    tree = ast.parse("".join(cell["source"]))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)}


def test_every_notebook_with_outputs_is_listed():
    """A new notebook that writes files must say which parameters are outputs (here)."""
    names = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert names == set(OUTPUTS)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_default_outputs_lie_outside_the_pipeline(name, monkeypatch):
    monkeypatch.delenv(notebook.STAGE_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    values = defaults(name)
    for param, kind in OUTPUTS[name].items():
        value = values[param]
        if value is not None:
            assert str(value).startswith("scratch/"), (name, param, value)
            notebook._check_pipeline({param: (value, kind)}, ROOT)  # no ConfigError


def test_pipeline_outputs_read_foreach_stages_as_wildcards():
    outs = notebook.pipeline_outputs(ROOT)
    assert outs["paper_figures/anchor_staleness.pdf"] == "staleness"
    assert "samples/*" in outs or any(o.startswith("samples/") and "*" in o for o in outs)
    assert notebook.pipeline_outputs(ROOT / "tests") == {}  # no dvc.yaml there


@pytest.mark.parametrize("value, kind", [("samples", "dir"), ("samples/tadm", "dir"), ("paper_figures", "dir"),
                                         (".", "dir"), ("paper_figures/anchor_staleness.pdf", "file"),
                                         ("results/table1.json", "file"), ("models/tadm/x", "dir")])
def test_a_path_over_a_pipeline_output_is_refused_in_one_line(value, kind, monkeypatch):
    monkeypatch.delenv(notebook.STAGE_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match="would write over the pipeline's output") as e:
        notebook._check_pipeline({"out_dir": (value, kind)}, ROOT)
    assert "\n" not in str(e.value) and "out_dir" in str(e.value)


@pytest.mark.parametrize("value, kind", [("scratch/x", "dir"), ("paper_figures_k4", "dir"), ("results/other.json", "file"),
                                         ("/tmp/figures", "dir")])
def test_paths_beside_the_outputs_pass(value, kind, monkeypatch):
    monkeypatch.delenv(notebook.STAGE_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    notebook._check_pipeline({"out_dir": (value, kind)}, ROOT)


def test_a_dvc_stage_writes_its_own_outputs(monkeypatch):
    monkeypatch.setenv(notebook.STAGE_ENV, "staleness")
    monkeypatch.chdir(ROOT)
    notebook._check_pipeline({"out_dir": ("paper_figures", "dir")}, ROOT)


def test_papermill_refuses_the_committed_figure_folder_before_any_work(tmp_path):
    """The documented alternate-K run, pointed at paper_figures by hand: one line, exit 2, nothing written."""
    env = {k: v for k, v in __import__("os").environ.items() if k != notebook.STAGE_ENV}
    proc = subprocess.run([sys.executable, "-m", "tadm.papermill_cli", "--no-progress-bar",
                           "notebooks/anchor_staleness.ipynb", str(tmp_path / "out.ipynb"), "-p", "K", "4",
                           "-p", "out_dir", "paper_figures"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "out_dir" in proc.stderr and "pipeline's output" in proc.stderr
