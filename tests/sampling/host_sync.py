"""Counting host synchronisations on the CPU.

`torch.cuda.set_sync_debug_mode` only exists on CUDA, so `count_host_syncs()` instead patches
every Python-visible operation that makes the host wait for a device's result: reading a value
(`item`, `tolist`, `bool` / `int` / `float` / `index` of a tensor, `cpu`, `numpy`, `.to` the
CPU, `torch.equal`), and the operations whose output *shape* depends on the data (`nonzero`,
`argwhere`, `masked_select`, `unique`, indexing or assigning with a boolean tensor). On a GPU
each of these stalls the launch queue until the device catches up; on the CPU they are free,
but they are the same calls, so counting them here counts them there.

    with count_host_syncs() as syncs:
        sample(...)
    syncs.total, syncs.by_site   # {"tadm/sampling/loop.py:123 item": n, ...}
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

from tadm import runtime

ROOT = Path(__file__).resolve().parents[2]
_BASE = torch._C.TensorBase
_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", torch.Tensor.cpu.__name__, "numpy",
            "nonzero", "argwhere", "masked_select", "unique")
_FUNCTIONS = ("nonzero", "argwhere", "masked_select", "unique", "equal")


class SyncLog:
    def __init__(self) -> None:
        self.by_site: Counter[str] = Counter()
        self.paused = 0

    @property
    def total(self) -> int:
        return sum(self.by_site.values())

    def hit(self, what: str) -> None:
        if self.paused:
            return
        frame = sys._getframe(2)
        while frame is not None:  # the first frame of this repository's code (not torch's, not this file's)
            path = Path(frame.f_code.co_filename)
            if path != Path(__file__).resolve() and ROOT in path.parents and ".venv" not in path.parts:
                self.by_site[f"{path.relative_to(ROOT)}:{frame.f_lineno} {what}"] += 1
                return
            frame = frame.f_back
        self.by_site[f"<torch> {what}"] += 1

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


def _is_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _to_cpu(args, kwargs) -> bool:
    targets = list(args) + [kwargs.get("device")]
    host = runtime.CPU.type
    return any((isinstance(a, str) and a.startswith(host)) or (isinstance(a, torch.device) and a.type == host)
               for a in targets)


class _BoolIndexMode(TorchFunctionMode):
    """Counts boolean-mask indexing (a data-dependent shape: a host read on a GPU)."""

    def __init__(self, log: "SyncLog"):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            if _is_bool_index(args[1]):
                self.log.hit("bool-index get" if func is torch.Tensor.__getitem__ else "bool-index set")
            return func(*args, **(kwargs or {}))
        with self.log.pause():  # `func` may be one of the patched methods: its own call was counted
            return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_syncs() -> Iterator[SyncLog]:
    log = SyncLog()
    saved: list[tuple[object, str, object, bool]] = []

    def patch(owner, name, make):
        own = name in vars(owner)
        original = getattr(owner, name)
        saved.append((owner, name, original, own))
        setattr(owner, name, make(original))

    def method(name):
        def make(original):
            def wrapper(self, *args, **kwargs):
                log.hit(name)
                with log.pause():  # a counted call may call others (tolist -> item, ...)
                    return original(self, *args, **kwargs)
            return wrapper
        return make

    def function(name):
        def make(original):
            def wrapper(*args, **kwargs):
                log.hit(f"torch.{name}")
                with log.pause():
                    return original(*args, **kwargs)
            return wrapper
        return make

    def to(original):
        def wrapper(self, *args, **kwargs):
            if _to_cpu(args, kwargs):
                log.hit("to(cpu)")
            return original(self, *args, **kwargs)
        return wrapper

    for name in _METHODS:
        patch(torch.Tensor, name, method(name))
    for name in _FUNCTIONS:
        patch(torch, name, function(name))
    patch(torch.Tensor, "to", to)
    # indexing is watched through a torch-function mode: a class attribute __getitem__ set on
    # torch.Tensor and deleted again leaves CPython's sequence slot behind (0-d tensors then look
    # like sequences to torch.tensor([...]) for the rest of the process)
    mode = _BoolIndexMode(log)
    mode.__enter__()
    try:
        yield log
    finally:
        mode.__exit__(None, None, None)
        for owner, name, original, own in reversed(saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
