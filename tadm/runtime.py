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
    runtime.compile    torch.compile the network that trains: each transformer block (and TADM's
                       fusion), tadm.train.trainer.compile_blocks
    runtime.cuda_graphs  CUDA-graph replay of the sampling network's fixed-shape pieces
                       (`tadm.cuda_graphs`); ignored, with a one-line note, off CUDA

Inference precision: a sampling model is cast once (:func:`cast_for_autocast`): the weights
bf16 autocast would cast at every network call (every Linear's) are cast to bf16 when the
model is loaded, so the per-call autocast only casts activations; the numbers are those of
per-call autocast bit for bit.

Every stage calls :func:`setup` once; it resolves the device (under torchrun each process
takes ``cuda:LOCAL_RANK``), sets the TF32 flags and joins the process group torchrun describes
(nccl on GPU, bound to that device; gloo on CPU) with a timeout of ``TADM_DIST_TIMEOUT_S``
seconds (:func:`dist_timeout`). A process of a group that fails ends at once, entering no
collective (:func:`exit_on_rank_error`); only a finished one leaves the group cleanly
(:func:`finish`). Work is split across processes with :func:`shard` (item i goes to
rank i mod world) and put back in order with :func:`gather`, so a stage's outputs do not depend
on the number of processes. This is the only module that names a device type as a string.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any, ContextManager, Iterator, NoReturn, Sequence

import torch
import torch.distributed as dist

from tadm.errors import ConfigError, TadmError

CPU = torch.device("cpu")


def autocast_state(device: torch.device) -> tuple:
    """(device type, the dtype autocast runs in there, or None when it is off or the type has no
    autocast): a key for what a cached computation depends on."""
    kind = device.type
    if kind not in ("cpu", "cuda") or not torch.is_autocast_enabled(kind):
        return (kind, None)
    return (kind, torch.get_autocast_dtype(kind))
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
        join_process_group(device)
    return Dist(dist.get_rank(), dist.get_world_size(), device, precision)


# ----------------------------------------------------------------------------- the process group

DIST_TIMEOUT_ENV = "TADM_DIST_TIMEOUT_S"
DIST_TIMEOUT_DEFAULT_S = 600.0


def dist_timeout() -> timedelta:
    """How long a collective (and joining the group) may wait for the other processes:
    ``TADM_DIST_TIMEOUT_S`` seconds, default :data:`DIST_TIMEOUT_DEFAULT_S`; anything but a
    positive number is a one-line ConfigError naming the variable."""
    raw = os.environ.get(DIST_TIMEOUT_ENV, "").strip()
    if not raw:
        return timedelta(seconds=DIST_TIMEOUT_DEFAULT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(DIST_TIMEOUT_ENV, f"must be a positive number of seconds, got {raw!r}", source="environment")
    return timedelta(seconds=seconds)


def join_process_group(device: torch.device) -> None:
    """Join the process group torchrun's variables describe: nccl bound to `device` on CUDA,
    gloo elsewhere, with :func:`dist_timeout`."""
    timeout = dist_timeout()
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=timeout)


def in_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def exit_code_of(error: BaseException) -> int:
    """The exit code of a process ended by `error`: a TadmError's own, 130 for Ctrl-C, else 1."""
    if isinstance(error, TadmError):
        return error.exit_code
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def rank_error_line(error: BaseException) -> str:
    """`error` as the one line a failed process of the group prints: ``error: rank R: ...``."""
    rank = dist.get_rank() if in_process_group() else os.environ.get("RANK", "?")
    if isinstance(error, TadmError):
        what = str(error)
    elif isinstance(error, KeyboardInterrupt):
        what = "interrupted"
    else:
        first = (str(error).splitlines() or [""])[0]
        what = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return f"error: rank {rank}: {what}"


def leave_on_error(error: BaseException, code: int) -> NoReturn:
    """End this process of a process group after `error` without entering any collective (a
    barrier or destroy_process_group would wait for processes that may be waiting for this one):
    the one line of :func:`rank_error_line` to stderr first, then the traceback of an error
    that is not a TadmError, then ``os._exit(code)``, which no thread (one stuck in a
    collective included) can hold up. The others see this process gone (gloo) or reach
    :func:`dist_timeout` (nccl), and torchrun stops the rest once one process fails."""
    print(rank_error_line(error), file=sys.stderr, flush=True)
    if not isinstance(error, (TadmError, KeyboardInterrupt)):
        traceback.print_exception(error, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be reported
            pass
    os._exit(code)


@contextmanager
def exit_on_rank_error() -> Iterator[None]:
    """Inside a process group, an exception (or Ctrl-C) in the block ends this process at once
    (:func:`leave_on_error`, exit code :func:`exit_code_of`); outside one it propagates."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as e:
        if in_process_group():
            leave_on_error(e, exit_code_of(e))
        raise


def finish(d: Dist) -> None:
    """The clean end of a process that succeeded: wait for the others, then leave the group."""
    if d.world > 1 and in_process_group():
        dist.barrier()
        dist.destroy_process_group()


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


def cast_for_autocast(model: torch.nn.Module, device: torch.device, precision: str = "bf16",
                      cpu_bf16: bool = True) -> torch.nn.Module:
    """Cast, once and in place, the weights that bf16 :func:`autocast` casts at every call: every
    ``nn.Linear``'s weight and bias, when :func:`effective_precision` is "bf16" (otherwise the
    model is left as it is: fp32 stays fp32). Returns `model`.

    Why: the samplers enter autocast around each network call, and autocast keeps its cast
    weights only until the outermost autocast exits (and, under inference_mode, not at all), so
    every call re-cast every fp32 weight to bf16: at batch 1, where a call is bound by reading
    its weights, 6 bytes moved per weight (4 read, 2 written) before the 2 the bf16 matmul reads. Cast once, a Linear's weights are bf16 already and autocast casts only its
    input, exactly as it did before: ``w.to(bf16)`` is the cast autocast makes, and the op
    (``linear`` in bf16) is the same, so outputs are bit-identical to per-call autocast.

    What stays fp32, on purpose: norms (LayerNorm weights; autocast runs layer_norm in fp32 on
    a GPU and in its input's dtype, the fp32 residual stream, on a CPU), embeddings (an
    embedding lookup is not an autocast op: its fp32 rows start the fp32 residual stream), and
    everything after the network (logits are cast to the sampler's precision, float64 by
    default, before SUBS / softmax / nucleus / the draw). The model must then be called under
    :func:`autocast` (a bf16 Linear fed fp32 raises), as the samplers always call it."""
    if effective_precision(device, precision, cpu_bf16) != "bf16":
        return model
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.to(torch.bfloat16)
    return model


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


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor `t` on `device`: for a GPU through pinned memory with a non-blocking copy, so
    the host goes on queueing work while it travels; on the CPU `t` itself."""
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


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


def thread_env(env: dict[str, str], threads: int | None) -> dict[str, str]:
    """`env` with OMP_NUM_THREADS / MKL_NUM_THREADS set to `threads` (a copy; unchanged when None)."""
    env = dict(env)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_jobs(commands: Sequence[tuple[str, Sequence[str]]], jobs: int, log=print, poll: float = 0.5,
             after: dict[str, Sequence[str]] | None = None) -> dict[str, float]:
    """Run independent commands, `jobs` at a time, in the given order; each process gets
    :func:`threads_per_job` intra-op threads (OMP_NUM_THREADS / MKL_NUM_THREADS) and prints to this
    process's stdout / stderr. `after` maps a command's name to the names that must finish first
    (the first ready command in the order starts when a slot frees). Returns each command's wall
    seconds by name.

    Why: at the default profile's sizes one training step uses two cores poorly (1.45x over one),
    while two runs side by side finish 1.30x sooner (docs/default-profile.md, "Two training jobs side by side";
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
    threads = threads_per_job(jobs)
    env = thread_env(dict(os.environ), threads)
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
           "barrier", "relaunch", "effective_precision", "cpu_has_bf16", "torchrun_argv", "under_torchrun", "configure_backends", "CPU",
           "dist_timeout", "DIST_TIMEOUT_ENV", "join_process_group", "in_process_group", "exit_code_of", "rank_error_line",
           "leave_on_error", "exit_on_rank_error", "finish", "cast_for_autocast"]
