"""Multi-process runs of the experiments: :func:`launch` starts ``python -m tadm.experiments.jobs <job> <spec.json>``.

The notebooks run in one kernel process. When a job runs in several processes (:func:`processes`:
``runtime.nproc`` > 1, or on a CPU ``runtime.cpu_processes`` > 1 for Table 1 and ASRD), the notebook-level
functions (`table2.run_row`, `table2.run_sweep`, `tadm.experiments.table1.run`,
`tadm.experiments.asrd.compare.run`) call :func:`launch`, which writes a spec file and runs

    python -m torch.distributed.run --standalone --nproc_per_node=N -m tadm.experiments.jobs <job> <spec.json>

(`runtime.torchrun_argv`). Every worker process joins the process group (`runtime.setup`: one
GPU per process, nccl; gloo on the CPU), runs the same function with its `Dist`, which splits
the work over the processes and gathers it back in order, and the main process writes the
function's outputs (atomically, as in one process) plus its return value to the spec's
``result`` file; the notebook then continues from that file. A process whose job raises prints
``error: rank R: ...`` and exits at once (`runtime.exit_on_rank_error`); torchrun then stops
the others and :func:`launch` reports that line first. In one process nothing is launched and
everything runs in the kernel.

Jobs and their ``args`` (paths relative to the working directory, which the workers share):

    row      {"name", "tokenizer", "packed_dir", "kwargs": run_row's keyword arguments}
    sweep    {"row", "tokenizer", "packed_dir", "kwargs": run_sweep's keyword arguments}
    table1   {"root", "sft_dir", "out", "unsafe_host_execution", "control"}
    table1_speed  {"block", "root", "sft_dir", "out", "control"}
    asrd     {"root", "out"}

The spec file: ``{"job": ..., "params": tadm.config.to_dict(params), "args": {...},
"result": path}``. On a cluster the same command runs under any torchrun invocation.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

from tadm import config, runtime
from tadm.config import Params
from tadm.errors import TadmError

MODULE = "tadm.experiments.jobs"  # the program every process runs (its job functions imported there)
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# torchrun's variables: a launch from inside a torchrun process must not inherit them
TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                "TORCHELASTIC_ERROR_FILE")


# jobs whose prompt batches split over runtime.cpu_processes on a CPU (each process one share of the
# CPU's threads); the others run in one process there
CPU_SPLIT_JOBS = ("table1", "table1_speed", "asrd")
# the jobs `tadm.experiments.jobs` runs (that module imports the job functions; the modules that
# launch jobs import this one, so this one cannot import them; a test holds the two lists equal)
JOB_NAMES = ("row", "sweep", "table1", "table1_speed", "asrd")


def plan(params: Params, job: str) -> tuple[int, int | None]:
    """How `job` runs under `params`: (processes, intra-op threads of each). runtime.nproc > 1:
    that many processes (one device each, threads inherited); on a CPU, runtime.cpu_processes
    for the jobs of :data:`CPU_SPLIT_JOBS`, each with its share of the CPU's threads
    (:func:`tadm.runtime.threads_per_job`); else one process."""
    rt = params.runtime
    if rt.nproc > 1:
        return rt.nproc, None
    if job in CPU_SPLIT_JOBS and rt.cpu_processes > 1 and runtime.resolve_device(rt.device) == runtime.CPU:
        return rt.cpu_processes, runtime.threads_per_job(rt.cpu_processes)
    return 1, None


def processes(params: Params, job: str) -> int:
    """How many processes `job` runs in (:func:`plan`)."""
    return plan(params, job)[0]


def needs_launch(params: Params, job: str) -> bool:
    """True when `job` runs in several processes under `params` and this one is not one of them already."""
    return processes(params, job) > 1 and not runtime.under_torchrun()


def _env(threads: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return runtime.thread_env(env, threads)


def launch(job: str, params: Params, args: dict[str, Any], log: Callable[[str], None] | None = None) -> Any:
    """Run `job` under torchrun with :func:`processes` processes, wait, and return what its
    main process returned (a JSON value). The workers' output is echoed line by line (into the
    notebook when called from one); a failed run is a TadmError with its last lines."""
    if job not in JOB_NAMES:
        raise TadmError(f"unknown worker job {job!r}; known: {', '.join(JOB_NAMES)}")
    echo = log or (lambda line: print(line, end="", flush=True))
    with tempfile.TemporaryDirectory(prefix="tadm-worker-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({"job": job, "params": config.to_dict(params), "args": args,
                                    "result": str(result)}, indent=2))
        n, threads = plan(params, job)
        argv = runtime.torchrun_argv(n, [MODULE, job, str(spec)])
        tail: collections.deque[str] = collections.deque(maxlen=30)
        cause = FailureCause()
        proc = subprocess.Popen(argv, env=_env(threads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            echo(line)
            tail.append(line)
            cause.read(line)
        rc = proc.wait()
        if rc != 0 or not result.is_file():
            why = f": {cause.line}" if cause.line else ""
            trace = "".join(cause.traceback)
            raise TadmError(f"`{' '.join(argv[1:])}` failed with exit code {rc}{why}\n" + (trace and f"{trace}...\n")
                            + "its last lines:\n" + "".join(tail))
        return json.loads(result.read_text())


class FailureCause:
    """The first failure a worker printed, read from torchrun's merged output line by line: a
    worker's one-line ``error: ...`` (a TadmError) or the exception line ending the first
    traceback (kept too, at most MAX_TRACE lines). torchrun's own failure summary, which fills
    the output's last lines, names only the exit code."""

    MAX_TRACE = 40

    def __init__(self):
        self.line: str | None = None
        self.traceback: list[str] = []
        self._open = False

    def read(self, raw: str) -> None:
        if self.line is not None:
            return
        line = re.sub(r"^\[(rank|default)?\d+\]: ?", "", raw.rstrip("\n"))  # torchrun's per-rank prefix, if any
        if self._open:
            if len(self.traceback) < self.MAX_TRACE:
                self.traceback.append(raw)
            if line and not line[0].isspace():  # the exception line closes the traceback
                self.line, self._open = line.strip(), False
        elif line.startswith("Traceback (most recent call last):"):
            self._open, self.traceback = True, [raw]
        elif line.startswith("error: "):
            self.line = line.removeprefix("error: ").strip()


def optional_path(value) -> Path | None:
    return None if value is None else Path(value)
