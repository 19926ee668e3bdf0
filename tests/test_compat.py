"""The transformers version gate of the DiffusionGemma paths (tadm.compat)."""

import re
import subprocess
import sys

import pytest

from tadm import compat, config
from tadm.errors import DependencyError, TadmError


def test_the_installed_transformers_passes():
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    assert compat.require_transformers() == transformers.__version__
    assert compat.transformers_problem() is None


@pytest.mark.parametrize("old", ["5.17.0", "5.23.9", "4.57.1"])
def test_an_older_transformers_is_one_line_naming_both_versions(monkeypatch, old):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    monkeypatch.setattr(transformers, "__version__", old)
    with pytest.raises(DependencyError) as e:
        compat.require_transformers(what="DiffusionGemma paths")
    message = str(e.value)
    assert "\n" not in message and isinstance(e.value, TadmError) and e.value.exit_code == 2
    assert f"transformers {old} is installed" in message
    assert f"transformers>={compat.MIN_TRANSFORMERS}" in message and "DiffusionGemma paths" in message
    assert f"transformers-{compat.PINNED_TRANSFORMERS}-py3-none-any.whl" in message


def test_newer_releases_pass(monkeypatch):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    for new in ("5.24.0", "5.24.3", "5.30.0"):
        monkeypatch.setattr(transformers, "__version__", new)
        assert compat.transformers_problem() is None


def test_the_cli_stops_at_the_import_of_a_diffusiongemma_path():
    """`python -m tadm dg-base` on transformers 5.17: one line, exit 2, before any model work."""
    code = ("import sys, transformers; transformers.__version__ = '5.17.0'\n"
            "from tadm.cli import main; sys.exit(main(['dg-base']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=config.ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: DiffusionGemma paths (tadm.posttrain.")
    assert "transformers 5.17.0 is installed" in lines[0] and ">=5.24" in lines[0]


def test_the_constants_match_the_pins():
    lock = (config.ROOT / "requirements" / "lock.txt").read_text()
    wheels = (config.ROOT / "benchmarks" / "gpu_wheels.txt").read_text()
    pyproject = (config.ROOT / "pyproject.toml").read_text()
    assert f"transformers=={compat.PINNED_TRANSFORMERS}\n" in lock and f"transformers=={compat.PINNED_TRANSFORMERS}" in wheels
    assert re.search(rf'"transformers>={re.escape(compat.MIN_TRANSFORMERS)},', pyproject)
    assert compat.PINNED_TRANSFORMERS.startswith(compat.MIN_TRANSFORMERS + ".")
