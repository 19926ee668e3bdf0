"""A run's code fingerprint reads the programs, not their text: docstrings, comments and layout
leave it, any change of what the code does moves it, and checkpoint I/O is outside it."""

from __future__ import annotations

import shutil

import pytest

from tadm.train import fingerprint, trainer
from tadm.train.fingerprint import code_fingerprint

MODULE = '''"""A module."""

import math


def f(x):
    """Doc."""
    return math.sqrt(x)  # a comment
'''


@pytest.fixture
def package(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(MODULE)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "io.py").write_text("X = 1\n")
    return tmp_path


@pytest.mark.parametrize("edit", [
    lambda s: s.replace('"""Doc."""', '"""Another docstring, longer,\n    on two lines."""'),
    lambda s: s.replace("# a comment", "# another comment"),
    lambda s: s.replace("import math\n", "import math\n\n\n# a block of comments\n"),
    lambda s: s.replace('"""A module."""\n', ""),
])
def test_text_that_is_not_the_program_leaves_the_fingerprint(package, edit):
    before = code_fingerprint(("pkg", "models"), package)
    (package / "pkg" / "a.py").write_text(edit(MODULE))
    assert code_fingerprint(("pkg", "models"), package) == before


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("math.sqrt(x)", "math.sqrt(x + 0)"),
    lambda s: s.replace("def f(x)", "def g(x)"),
    lambda s: s + "\nEPS = 1e-3\n",
])
def test_a_change_of_the_program_moves_it(package, edit):
    before = code_fingerprint(("pkg",), package)
    (package / "pkg" / "a.py").write_text(edit(MODULE))
    assert code_fingerprint(("pkg",), package) != before


def test_checkpoint_io_is_outside_and_a_new_file_inside(package):
    before = code_fingerprint(("pkg", "models"), package)
    (package / "models" / "io.py").write_text("X = 2\n")  # NOT_OBJECTIVE
    assert code_fingerprint(("pkg", "models"), package) == before
    (package / "models" / "other.py").write_text("Y = 1\n")
    assert code_fingerprint(("pkg", "models"), package) != before
    with pytest.raises(FileNotFoundError, match="nope"):
        code_fingerprint(("nope",), package)


def test_the_training_runs_sources_exist_and_leave_io_out():
    files = fingerprint.source_files(trainer.CODE)
    names = {f.relative_to(fingerprint.PACKAGE).as_posix() for f in files}
    assert {"train/trainer.py", "methods/base.py", "models/base.py", "losses.py"} <= names
    assert "models/io.py" not in names and len(trainer.code_hash()) == 64


def test_the_package_copy_fingerprints_alike(tmp_path):
    """The same sources under another root (a fresh clone) give the same fingerprint."""
    copy = tmp_path / "tadm"
    shutil.copytree(fingerprint.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert code_fingerprint(trainer.CODE, copy) == code_fingerprint(trainer.CODE)
