"""The training notebook runs through papermill on the micro profile (the other notebooks run
inside the DVC pipeline of tests/test_pipeline.py)."""

import json

import pytest

from tadm.config import ROOT
from tests.conftest import micro_raw, write_params

pytestmark = pytest.mark.slow


def test_train_notebook_trains_and_plots(micro_packed, tmp_path):
    import papermill

    params = write_params(tmp_path / "params.yaml", micro_raw(**{"train.steps": 3, "train.eval_every": 3}))
    out = tmp_path / "train.ipynb"
    papermill.execute_notebook(str(ROOT / "notebooks" / "train.ipynb"), str(out), cwd=str(ROOT), progress_bar=False,
                               parameters=dict(run="mdlm", params_file=str(params), data=str(micro_packed),
                                               root=str(tmp_path / "run")))
    assert (tmp_path / "run" / "models" / "mdlm" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "run" / "metrics" / "train" / "mdlm.json").read_text())["steps"] == 3
    cells = json.loads(out.read_text())["cells"]
    assert any(o.get("output_type") == "display_data" for c in cells for o in c.get("outputs", []))  # the plot
