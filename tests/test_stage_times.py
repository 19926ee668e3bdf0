"""The pipeline's stage timer: a wrapped command's exit code passes through, a successful one
leaves a record (wall time, peak RSS of its processes), and `collect` builds the table."""

import os
import json
import sys

import pytest

from tadm import stage_times
from tadm.errors import DataError


def test_run_records_time_and_peak_memory_and_passes_the_exit_code(tmp_path):
    # a child that holds ~64 MiB for a moment: the peak RSS must see it
    code = "import time; b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.2)"
    assert stage_times.run("big", [sys.executable, "-c", code], records=tmp_path) == 0
    rec = json.loads((tmp_path / "big.json").read_text())
    assert rec["stage"] == "big" and rec["seconds"] >= 0.2
    assert rec["peak_rss_mib"] >= 64
    before, after = rec["probe_gflops"]  # the machine's speed around the stage
    assert before > 0 and after > 0

    assert stage_times.run("fails", [sys.executable, "-c", "raise SystemExit(3)"], records=tmp_path) == 3
    assert not (tmp_path / "fails.json").exists()  # no record for a failed stage


def test_collect_writes_the_summary_and_the_table(tmp_path):
    probes = {"a": [10.0, 30.0], "b": [20.0, 21.0], "c": None}  # c: a record from before the probe
    for name, secs in (("a", 1.0), ("b", 120.0), ("c", 2.0)):
        rec = {"stage": name, "seconds": secs, "peak_rss_mib": 100.0 * secs, "started": "t", "cpus": 2}
        if probes[name]:
            rec["probe_gflops"] = probes[name]
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    out = stage_times.collect(["a", "b", "c"], records=tmp_path, summary=tmp_path / "s.json", table=tmp_path / "t.md")
    assert out["total_seconds"] == 123.0 and out["max_peak_rss_mib"] == 12000.0
    assert list(out["stages"]) == ["a", "b", "c"]
    assert out["probe_gflops_median"] == 20.5 and out["probe_gflops_range"] == [10.0, 30.0]
    table = (tmp_path / "t.md").read_text()
    assert "| b | 120 | 2.0 | 12000 | 20.0 / 21.0 |" in table and "| c | 2 | 0.0 | 200 | - |" in table
    assert "**123**" in table and "20.5 (median)" in table
    with pytest.raises(DataError, match="no time record for stage.*missing"):
        stage_times.collect(["a", "missing"], records=tmp_path, summary=tmp_path / "s.json", table=tmp_path / "t.md")


def test_the_probe_measures_the_fixed_product(monkeypatch):
    # a clock that advances 0.1 s per reading: every round lasts 0.1 s, so the speed is the
    # round's FLOPs / 0.1 s
    clock = iter(range(10**6))
    monkeypatch.setattr(stage_times.time, "perf_counter", lambda: next(clock) * 0.1)
    flops = stage_times.PROBE_PRODUCTS * 2 * stage_times.PROBE_N ** 3
    assert stage_times.probe(rounds=3) == pytest.approx(flops / 0.1 / 1e9)


def test_the_cli_runs_the_command_after_the_separator(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # records go to metrics/stage_times/ under the working directory
    assert stage_times.main(["run", "x", "--", sys.executable, "-c", "pass"]) == 0
    assert json.loads((tmp_path / "metrics/stage_times/x.json").read_text())["stage"] == "x"
    assert stage_times.main(["run", "y", "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5


def test_a_papermill_stage_runs_without_the_iri_grammar_and_executes_the_notebook(tmp_path):
    """`papermill ...` starts as `python -m tadm.papermill_cli ...`: the same CLI and notebook,
    without jsonschema's optional rfc3987_syntax (3 s of Lark grammar at every start)."""
    import subprocess

    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import sys; print(x * 7, 'rfc3987_syntax' in sys.modules)")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    assert stage_times._launch(["papermill", "a", "b"]) == [sys.executable, "-m", "tadm.papermill_cli", "a", "b"]
    assert stage_times._launch(["python", "-m", "tadm"]) == ["python", "-m", "tadm"]
    cmd = ["papermill", "--no-progress-bar", str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), "-p", "x", "6"]
    assert stage_times.run("nb", cmd, records=tmp_path) == 0
    assert json.loads((tmp_path / "nb.json").read_text())["command"] == " ".join(cmd)  # the stage's own command
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[-1].outputs[0]["text"] == "42 False\n"  # the parameter reached the kernel
    probe = ("import sys\nfrom tadm import papermill_cli\nsys.argv = ['papermill', '--help']\ntry:\n"
             "    papermill_cli.main()\nexcept SystemExit:\n    pass\nprint('loaded', sys.modules['rfc3987_syntax'])")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "Usage: papermill" in shown and shown.rstrip().endswith("loaded None")


def test_a_stage_still_running_refuses_a_second_run_in_one_line(tmp_path, monkeypatch):
    """A killed dvc can leave its stage running; a rerun of that stage beside it is refused (exit
    3, one line naming the stage and the holder), and once the first run ends -- even when only
    its command was left, its wrapper killed -- the stage runs again."""
    import signal
    import subprocess
    import sys
    import time

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    first = subprocess.Popen([sys.executable, "-m", "tadm.stage_times", "run", "slow", "--", sys.executable, "-c",
                              "import time; time.sleep(30)"], cwd=tmp_path, start_new_session=True)
    lock = tmp_path / ".dvc" / "tmp" / "stage-slow.lock"
    for _ in range(200):
        if lock.is_file() and lock.read_text().startswith("pid"):
            break
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-m", "tadm.stage_times", "run", "slow", "--", sys.executable, "-c", "pass"],
                            cwd=tmp_path, capture_output=True, text=True)
    err = second.stderr.strip()
    assert second.returncode == 3 and err.count("\n") == 0 and "stage slow is already running (pid" in err, err
    first.send_signal(signal.SIGKILL)  # the wrapper alone: its command keeps the lock
    first.wait()
    again = subprocess.run([sys.executable, "-m", "tadm.stage_times", "run", "slow", "--", sys.executable, "-c", "pass"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 3, again.stderr
    os.killpg(first.pid, signal.SIGKILL)  # the orphaned command too
    time.sleep(0.5)
    done = subprocess.run([sys.executable, "-m", "tadm.stage_times", "run", "slow", "--", sys.executable, "-c", "pass"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "metrics" / "stage_times" / "slow.json").is_file()
