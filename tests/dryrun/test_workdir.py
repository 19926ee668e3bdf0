"""`python -m tadm.dryrun --workdir` that is a file or cannot be created ends in one line naming
the parameter and a non-zero exit, not a traceback."""

import subprocess
import sys

import pytest

from tadm import config


def _dryrun(*args):
    return subprocess.run([sys.executable, "-m", "tadm.dryrun", *args], capture_output=True, text=True,
                          cwd=config.ROOT, timeout=120)


@pytest.mark.parametrize("kind", ["file", "proc", "under-a-file"])
def test_a_bad_workdir_is_one_line(tmp_path, kind):
    (tmp_path / "afile").write_text("")
    workdir, words = {"file": (tmp_path / "afile", "not a directory"),
                      "proc": ("/proc/x", "cannot create or write it (No such file or directory)"),
                      "under-a-file": (tmp_path / "afile" / "sub", "cannot create or write it (Not a directory)")}[kind]
    proc = _dryrun("--workdir", str(workdir))
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr and "[dry run]" not in proc.stdout  # refused before any step
    assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0], proc.stderr
    assert proc.stderr.startswith(f"--workdir {workdir}: {words}"), proc.stderr
