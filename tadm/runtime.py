"""Where and how a stage runs: the device, the precision, the process group.

One setting, the ``runtime`` section of params.yaml, says it for every stage (train, sample,
sweep, staleness, compute column, scoring, dg_base, dg_posttrain, table1, asrd):

    runtime.device     auto (CUDA when present, else CPU) | cpu | cuda | cuda:N
    runtime.precision  bf16 | fp32: autocast of sampling and scoring on a GPU; on a CPU that
                       multiplies bf16 natively (AVX512-BF16 / AMX) of sampling only (scorers
                       pass ``cpu_bf16=False``); other CPUs run fp32
    runtime.tf32       TF32 matmuls / convolutions on Ampere and newer GPUs
    runtime.nproc      processes per node; >1 relaunches a stage under torchrun
    runtime.jobs       independent runs of the train stage at a time (:func:`run_jobs`), each with
                       1/jobs of the CPU's threads: small models use two threads poorly
    runtime.compile    torch.compile the network that trains

Every stage calls :func:`setup` once; it resolves the device (under torchrun each process
takes ``cuda:LOCAL_RANK``), sets the TF32 flags and joins the process group torchrun describes
(nccl on GPU, gloo on CPU). Work is split across processes with :func:`shard` (item i goes to
rank i mod world) and put back in order with :func:`gather`, so a stage's outputs do not depend
on the number of processes. This is the only module that names a device type as a string.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ContextManager, Sequence

import torch
import torch.distributed as dist

from tadm.errors import ConfigError, TadmError

CPU = torch.device("cpu")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


@dataclass
class Dist:
    """This process's place in the run: rank, world size and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: CPU)
    precision: str = "fp32"  # autocast of inference on `device` (see effective_precision)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def autocast(self, cpu_bf16: bool = True) -> ContextManager:
        return autocast(self.device, self.precision, cpu_bf16)

    def effective_precision(self, cpu_bf16: bool = True) -> str:
        return effective_precision(self.device, self.precision, cpu_bf16)


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def resolve_device(setting: str = "auto") -> torch.device:
    """`runtime.device` as a torch.device. Under torchrun, "auto" and "cuda" take
    ``cuda:LOCAL_RANK``; asking for CUDA where there is none is a one-line ConfigError."""
    if not DEVICE_PATTERN.match(setting):
        raise ConfigError("runtime.device", f"must be auto, cpu, cuda or cuda:N, got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return CPU
    if not torch.cuda.is_available():
        raise ConfigError("runtime.device", f"{setting!r} asked for, but torch sees no CUDA device "
                          "(torch.cuda.is_available() is False); use auto or cpu")
    index = int(setting.split(":")[1]) if ":" in setting else int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise ConfigError("runtime.device", f"cuda:{index} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def configure_backends(tf32: bool = True) -> None:
    """TF32 on (or off) for CUDA matmuls and cuDNN convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def setup(rt: Any = None) -> Dist:
    """Resolve the device of `rt` (a RuntimeConfig; None = auto / bf16 / TF32), set the
    backend flags and join torchrun's process group when there is one."""
    device_setting = getattr(rt, "device", "auto")
    precision = getattr(rt, "precision", "bf16")
    device = resolve_device(device_setting)
    if device.type == "cuda":
        configure_backends(getattr(rt, "tf32", True))
        torch.cuda.set_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(0, 1, device, precision)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), device, precision)


@lru_cache(maxsize=None)
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX, as oneDNN reports it).
    Elsewhere bf16 matmuls are emulated and slower than fp32, so the CPU stays in fp32."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def effective_precision(device: torch.device, precision: str = "bf16", cpu_bf16: bool = True) -> str:
    """What `precision` means on `device`: "bf16" when asked for on CUDA, or on a CPU with native
    bf16 (:func:`cpu_has_bf16`) for a computation that accepts it there (`cpu_bf16`); otherwise
    "fp32". The scorers pass ``cpu_bf16=False``: on this project's CPU, bf16 evaluator features
    moved MAUVE(data, data) from 0.921 to 0.896, under the evaluator's 0.9 sanity line, and the
    small judge costs seconds next to the samplers. Sampling records keep both this and the
    setting."""
    if precision != "bf16":
        return "fp32"
    kind = torch.device(device).type
    return "bf16" if kind == "cuda" or (kind == "cpu" and cpu_bf16 and cpu_has_bf16()) else "fp32"


def autocast(device: torch.device, precision: str = "bf16", cpu_bf16: bool = True) -> ContextManager:
    """bf16 autocast on `device` when :func:`effective_precision` says so; otherwise nothing
    (fp32). Weights stay fp32 under it; matmuls, attention and their inputs run in bf16."""
    if effective_precision(device, precision, cpu_bf16) == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (timing); a no-op on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def device_free_bytes(device) -> tuple[bool, int | None]:
    """(whether `device` holds its own memory, its free bytes): a CUDA device -> (True, free
    bytes); the meta device -> (True, None: nothing to check); anything else (the CPU) ->
    (False, None): the host's memory applies."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return True, int(torch.cuda.mem_get_info(dev)[0])
    return dev.type == "meta", None


def host(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values on the host (for saving, numpy, JSON)."""
    return t.detach().to(CPU)


# ----------------------------------------------------------------------------- work split


def shard(n: int, d: Dist) -> list[int]:
    """The items of 0..n-1 that process `d.rank` does: i mod world == rank."""
    return list(range(d.rank, n, d.world))


def gather(mine: Sequence[Any], n: int, d: Dist) -> list[Any]:
    """Every process's `mine` (its :func:`shard` of n items, in order) put back into item order
    0..n-1, on every process."""
    if d.world == 1:
        return list(mine)
    parts: list[Any] = [None] * d.world
    dist.all_gather_object(parts, list(mine))
    out: list[Any] = [None] * n
    for rank, part in enumerate(parts):
        for j, item in enumerate(part):
            out[rank + j * d.world] = item
    return out


def all_mean(value: float, d: Dist) -> float:
    if d.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.item() / d.world


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- launching


def torchrun_argv(nproc: int, module_argv: Sequence[str]) -> list[str]:
    """The command that runs ``python -m <module_argv>`` as `nproc` processes on this node."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", *module_argv]


def relaunch(nproc: int, module_argv: Sequence[str]) -> bool:
    """Run ``python -m <module_argv>`` under torchrun with `nproc` processes and wait for it.

    Returns False (and does nothing) when one process is asked for or this process already
    belongs to a torchrun group (multi-node runs call torchrun themselves, README). A failed
    child is a TadmError naming the command."""
    if nproc <= 1 or under_torchrun():
        return False
    argv = torchrun_argv(nproc, module_argv)
    rc = subprocess.call(argv)
    if rc != 0:
        raise TadmError(f"`{' '.join(argv[1:])}` failed with exit code {rc} (its processes printed why above)")
    return True


def job_threads(jobs: int, cores: int | None = None) -> int:
    """Intra-op threads for each of `jobs` concurrent processes on `cores` (default: torch's)."""
    return max(1, (cores or torch.get_num_threads()) // max(1, jobs))


def threads_per_job(jobs: int) -> int | None:
    """The OMP_NUM_THREADS :func:`run_jobs` gives each of `jobs` processes: :func:`job_threads`,
    or None (the inherited setting) when they run one at a time."""
    return job_threads(jobs) if jobs > 1 else None


def run_jobs(commands: Sequence[tuple[str, Sequence[str]]], jobs: int, log=print, poll: float = 0.5,
             after: dict[str, Sequence[str]] | None = None) -> dict[str, float]:
    """Run independent commands, `jobs` at a time, in the given order; each process gets
    :func:`threads_per_job` intra-op threads (OMP_NUM_THREADS / MKL_NUM_THREADS) and prints to this
    process's stdout / stderr. `after` maps a command's name to the names that must finish first
    (the first ready command in the order starts when a slot frees). Returns each command's wall
    seconds by name.

    Why: at the default profile's sizes one training step uses two cores poorly (1.45x over one),
    while two runs side by side finish 1.30x sooner (README, "Two training jobs side by side";
    benchmarks/results/threads.md). A failed command stops new starts; the running ones finish
    (their checkpoints stay), then a TadmError names every failure. Interrupted (Ctrl-C), the
    children get SIGINT too and are waited for."""
    if jobs < 1:
        raise ConfigError("runtime.jobs", f"must be >= 1, got {jobs}")
    after = {name: set(names) for name, names in (after or {}).items()}
    names = [name for name, _ in commands]
    unknown = sorted(set().union(*after.values()) - set(names)) if after else []
    if unknown:
        raise TadmError(f"run_jobs: after names {unknown}, which no command is called")
    env = dict(os.environ)
    threads = threads_per_job(jobs)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    queue, running, seconds, failed = list(commands), {}, {}, []

    def ready() -> tuple[str, Sequence[str]] | None:
        return next((job for job in queue if after.get(job[0], set()) <= seconds.keys()), None)

    try:
        while queue or running:
            while len(running) < jobs and not failed and (job := ready()) is not None:
                queue.remove(job)
                name, argv = job
                log(f"[jobs] {name}: started ({len(running) + 1} running{f', {threads} thread(s) each' if threads else ''})")
                running[name] = (subprocess.Popen(list(argv), env=env), time.perf_counter())
            if failed:
                queue.clear()
            if queue and not running and ready() is None:  # a cycle in `after`
                raise TadmError(f"run_jobs: {[name for name, _ in queue]} wait for each other (after: {after})")
            for name, (proc, t0) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[name]
                elapsed = time.perf_counter() - t0
                log(f"[jobs] {name}: {'done' if rc == 0 else f'FAILED (exit code {rc})'} after {elapsed:.0f} s")
                if rc == 0:
                    seconds[name] = elapsed
                else:
                    failed.append(f"{name} (exit code {rc}: `{' '.join(_argv_of(proc))}`)")
            time.sleep(poll if running else 0)
    finally:
        for proc, _ in running.values():  # Ctrl-C reached them too; let them save and stop
            proc.wait()
    if failed:
        raise TadmError(f"{len(failed)} job(s) failed: {'; '.join(failed)} (their output is above)")
    return seconds


def _argv_of(proc: subprocess.Popen) -> list[str]:
    return [str(a) for a in proc.args]


__all__ = ["Dist", "run_jobs", "job_threads", "threads_per_job", "setup", "resolve_device", "autocast", "synchronize", "host", "shard", "gather", "all_mean",
           "barrier", "relaunch", "effective_precision", "cpu_has_bf16", "torchrun_argv", "under_torchrun", "configure_backends", "CPU"]
