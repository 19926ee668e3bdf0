"""Table 1 before the train stage: the local base missing is the one-line
"no DiffusionGemma checkpoint here" error, not a hub lookup of "models/dg_base" (Path('.') /
'models/dg_base' drops the "./" by which the loader tells a local directory from a hub id)."""

from pathlib import Path

import pytest

from tadm import config
from tadm.errors import DataError
from tadm.experiments import diffusiongemma
from tests.conftest import micro_raw


@pytest.mark.parametrize("root", [".", "run"])
def test_load_models_without_the_trained_base_names_the_train_stage(tmp_path, monkeypatch, root):
    monkeypatch.chdir(tmp_path)
    p = config.from_dict(micro_raw())
    assert p.posttrain.base_model == "local"
    with pytest.raises(DataError) as e:
        diffusiongemma.load_models(p, Path(root))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{Path(root) / 'models/dg_base'}: no DiffusionGemma checkpoint here"), message
    assert "run dvc repro train" in message


def test_dg_posttrain_without_the_trained_base_names_the_train_stage(tmp_path, monkeypatch):
    """`python -m tadm dg-posttrain` before dg-base used to look "models/dg_base" up on the hub
    (posttrain.base_source drops the "./"): load_base is now told the base is local."""
    from tadm.posttrain.train import train_fusion

    monkeypatch.chdir(tmp_path)
    p = config.from_dict(micro_raw())
    with pytest.raises(DataError) as e:
        train_fusion(p, sft_dir=tmp_path / "data/sft", root=Path("."), log=lambda *_: None)
    message = str(e.value)
    assert "\n" not in message and message.startswith("models/dg_base: no DiffusionGemma checkpoint here"), message
