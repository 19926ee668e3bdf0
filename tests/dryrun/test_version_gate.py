"""The dry run runs the DiffusionGemma paths' transformers gate first and records it in its log."""

import pytest

from tadm import compat
from tadm.dryrun import run


def test_the_gate_is_recorded_in_the_log(tmp_path):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    log = tmp_path / "dry-run.log"
    line = run.version_gate(log)
    assert line == f"transformers {transformers.__version__} (DiffusionGemma paths need >= {compat.MIN_TRANSFORMERS}): ok"
    assert log.read_text() == f"[dry run] version gate: {line}\n"


def test_an_older_transformers_stops_the_dry_run_in_one_line(tmp_path, monkeypatch, capsys):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(SystemExit) as e:
        run.version_gate(tmp_path / "dry-run.log")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "transformers 5.17.0 is installed" in err[0] and ">=5.24" in err[0]
    assert not (tmp_path / "dry-run.log").exists()
