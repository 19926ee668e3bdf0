"""A process of a process group that fails ends the job (tadm.runtime: the group's timeout,
exit_on_rank_error, finish): two gloo processes on the CPU run the worker entry point
(`tadm.experiments.jobs.main`, which joins the group through `runtime.setup`) as torchrun
would start them; rank 1 raises mid-job while rank 0 waits in a barrier for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tadm import config, runtime
from tadm.errors import ConfigError, DataError
from tadm.experiments import worker
from tests.conftest import micro_raw

TIMEOUT_S = 30  # TADM_DIST_TIMEOUT_S of the two processes: the job must end well before it
GUARD_S = 60  # this test's own limit on the two processes, so that a hang fails it, not CI
FAILURE = "rank-failure test: rank 1 fails mid-job"

# one process of the job: the test's jobs registered, then the worker's entry point as torchrun runs it
_RANK_SCRIPT = """
import sys
from tadm.experiments import jobs
from tests.test_rank_failure import failing_job, passing_job
jobs.JOBS.update(fail=failing_job, ok=passing_job)
sys.exit(jobs.main(sys.argv[1:]))
"""


def failing_job(p, d: runtime.Dist, args: dict) -> dict:
    """Rank 1 raises with a collective of its own still in flight in another thread (a side
    group's barrier rank 0 never joins: a non-daemon thread that would hold up a normal exit),
    while rank 0 waits in a barrier on the main group that rank 1 never reaches."""
    side = dist.new_group(backend="gloo")
    runtime.barrier(d)  # both processes are in the job
    if d.rank == 1:
        threading.Thread(target=dist.barrier, kwargs={"group": side}, name="stuck-collective").start()
        time.sleep(0.5)  # the thread is inside its collective
        raise DataError(FAILURE)
    runtime.barrier(d)
    return {}


def passing_job(p, d: runtime.Dist, args: dict) -> dict:
    return {"world": d.world, "mean": runtime.all_mean(float(d.rank), d)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path: Path, job: str) -> tuple[list[int], str, float, Path]:
    """Run `job` as two processes (rank 0, rank 1) whose output goes, in order, to one log;
    return their exit codes, the log, the wall seconds and the result file."""
    result = tmp_path / "result.json"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"job": job, "params": config.to_dict(config.from_dict(micro_raw())), "args": {},
                                "result": str(result)}))
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    log = tmp_path / "ranks.log"
    base = {k: v for k, v in os.environ.items() if k not in worker.TORCHRUN_ENV}
    base.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                OMP_NUM_THREADS="1", PYTHONPATH=str(config.ROOT), **{runtime.DIST_TIMEOUT_ENV: str(TIMEOUT_S)})
    t0 = time.perf_counter()
    with open(log, "ab") as out:  # append mode: the two processes' lines land in the order written
        procs = [subprocess.Popen([sys.executable, str(script), job, str(spec)], cwd=str(config.ROOT),
                                  env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=out, stderr=out)
                 for r in range(2)]
        try:
            codes = [proc.wait(timeout=max(1.0, GUARD_S - (time.perf_counter() - t0))) for proc in procs]
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
                proc.wait()
            pytest.fail(f"the two processes hung for {GUARD_S} s:\n{log.read_text()[-3000:]}")
    return codes, log.read_text(), time.perf_counter() - t0, result


def test_a_failing_rank_ends_the_job_at_once_and_its_error_comes_first(tmp_path):
    codes, text, seconds, _ = _run_ranks(tmp_path, "fail")
    assert seconds < TIMEOUT_S, f"the job took {seconds:.0f} s, past no timeout of {TIMEOUT_S} s:\n{text[-3000:]}"
    assert codes[1] == DataError.exit_code, text[-3000:]
    assert codes[0] != 0, text[-3000:]  # its barrier lost rank 1: it fails too, and on its own
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert errors and errors[0] == f"error: rank 1: {FAILURE}", text[-3000:]
    assert any(line.startswith("error: rank 0: ") for line in errors), text[-3000:]
    cause = worker.FailureCause()  # what worker.launch reports from torchrun's merged output
    for line in text.splitlines(keepends=True):
        cause.read(line)
    assert cause.line == f"rank 1: {FAILURE}"


def test_ranks_that_succeed_leave_the_group_cleanly(tmp_path):
    codes, text, _, result = _run_ranks(tmp_path, "ok")
    assert codes == [0, 0], text[-3000:]
    assert "error" not in text, text[-3000:]
    assert result.read_text() == '{"world": 2, "mean": 0.5}'


# ----------------------------------------------------------------------------- the settings


def test_the_timeout_comes_from_the_environment_with_a_default(monkeypatch):
    monkeypatch.delenv(runtime.DIST_TIMEOUT_ENV, raising=False)
    assert runtime.dist_timeout() == timedelta(seconds=runtime.DIST_TIMEOUT_DEFAULT_S)
    monkeypatch.setenv(runtime.DIST_TIMEOUT_ENV, "45")
    assert runtime.dist_timeout() == timedelta(seconds=45)


@pytest.mark.parametrize("bad", ["0", "-3", "ten", "nan", "inf"])
def test_a_bad_timeout_is_one_line_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv(runtime.DIST_TIMEOUT_ENV, bad)
    with pytest.raises(ConfigError) as e:
        runtime.dist_timeout()
    message = str(e.value)
    assert "\n" not in message and runtime.DIST_TIMEOUT_ENV in message and repr(bad) in message, message


@pytest.mark.parametrize("device, expected", [(torch.device("cuda", 1), ("nccl", torch.device("cuda", 1))),
                                              (runtime.CPU, ("gloo", None))])
def test_the_group_gets_the_timeout_and_on_cuda_its_device(monkeypatch, device, expected):
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setenv(runtime.DIST_TIMEOUT_ENV, "12")
    runtime.join_process_group(device)
    (backend, kwargs), = calls
    assert (backend, kwargs.get("device_id")) == expected
    assert kwargs["timeout"] == timedelta(seconds=12)


def test_outside_a_group_an_error_propagates():
    with pytest.raises(DataError):
        with runtime.exit_on_rank_error():
            raise DataError("x")


def test_a_command_failing_in_a_group_exits_at_once_naming_its_rank(monkeypatch, capsys, tmp_path):
    """`python -m tadm ...` as one process of a group: a one-line error ends it through
    runtime.leave_on_error (here os._exit is caught), not through the normal return."""
    from tadm import cli

    class Exited(Exception):
        pass

    def fake_exit(code: int):
        raise Exited(code)

    monkeypatch.setattr(runtime, "in_process_group", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 3)
    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(Exited) as e:
        cli.main(["--params", str(tmp_path / "params.yaml"), "profile", "no-such-profile"])
    assert e.value.args == (2,)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: rank 3: ") and "no-such-profile" in first, first
