"""Stop a run that diverged, before it saves anything.

A training step whose loss or gradient norm is NaN or infinite poisons the weights for good
(AdamW's moments keep the NaN). So does a step whose readout had more scored rows than its
fixed capacity (tadm.losses.Readout: its loss is NaN then, never a sum over fewer rows).
:class:`FiniteWatch` notes the first such step on the device --
a few scalar kernels per step, no host sync -- and :meth:`FiniteWatch.check` reads it at the steps
where the loop syncs anyway (logging, evaluation, checkpointing, the end). A diverged run raises
:class:`Diverged`: one line naming the step, the quantity and its value, and the last good
checkpoint, which is kept (the check runs before every save). :func:`first_non_finite` is the
same test for a whole state dict: a checkpoint is never written with, nor resumed from,
non-finite weights.
"""

from __future__ import annotations

import math
from typing import Callable, Union

import torch
import torch.distributed as dist

from tadm.errors import TadmError

__all__ = ["CapacityExceeded", "Diverged", "FiniteWatch", "check_value", "check_excess", "first_non_finite"]

QUANTITIES = ("loss", "gradient norm", "readout's scored rows past its capacity")
OVER_CAPACITY = 2  # the index of QUANTITIES a readout's overflow is recorded under


class Diverged(TadmError):
    """A training run met a non-finite loss, gradient norm or validation value."""


class CapacityExceeded(Diverged):
    """A readout scored more rows than its fixed capacity (an event the capacity's bound puts
    below 1e-15 per draw: the noise draw no longer matches `forward_process.masked_rows_capacity`)."""


def _over_capacity(run: str, where: str, rows: int, hint: str) -> CapacityExceeded:
    return CapacityExceeded(f"train[{run}]: a readout {where} scored {rows} rows more than its capacity "
                            f"(tadm.forward_process.masked_rows_capacity), so its loss was not computed; {hint}")


def check_excess(run: str, where: str, excess: float) -> None:
    """Raise :class:`CapacityExceeded` if `excess` (a host number read from Method.take_excess)
    is positive."""
    if excess > 0:
        raise _over_capacity(run, where, int(excess), "stopped; the batch's noise no longer matches the bound")


# what the error says about the kept checkpoint: a string, or a function asked only when a run
# has diverged (the directory is not listed on the steps that are fine)
LastGood = Union[str, Callable[[], str]]


def _hint(last_good: LastGood) -> str:
    said = last_good() if callable(last_good) else last_good
    return f"stopped, {said}; lower the learning rate or raise the warm-up, then resume"


def check_value(run: str, what: str, step: int, value: float, last_good: LastGood) -> None:
    """Raise :class:`Diverged` if `value` (a host float: a validation NELBO, a logged loss) is
    NaN or infinite."""
    if not math.isfinite(value):
        raise Diverged(f"train[{run}]: the {what} is {value} at step {step} (the run diverged); {_hint(last_good)}")


class FiniteWatch:
    """The first step whose loss or gradient norm is not finite, kept on `device`."""

    def __init__(self, run: str, device: torch.device):
        self.run = run
        self.step = torch.full((), -1, dtype=torch.long, device=device)  # -1: every step finite so far
        self.value = torch.zeros((), dtype=torch.float64, device=device)
        self.what = torch.zeros((), dtype=torch.long, device=device)  # an index into QUANTITIES

    @torch.no_grad()
    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor,
                excess: torch.Tensor | None = None) -> None:
        """Record `step` (1-based, the step just taken) if it is the first non-finite one;
        `excess` (Method.take_excess): rows past a readout's capacity, the cause when positive."""
        loss_ok, grad_ok = torch.isfinite(loss), torch.isfinite(grad_norm)
        over = torch.zeros((), dtype=torch.bool, device=loss.device) if excess is None else excess > 0
        first = (self.step < 0) & (~(loss_ok & grad_ok) | over)
        self.step = torch.where(first, torch.full_like(self.step, step), self.step)
        value = torch.where(loss_ok, grad_norm.double(), loss.double())
        what = loss_ok.long()
        if excess is not None:
            value = torch.where(over, excess.double(), value)
            what = torch.where(over, torch.full_like(what, OVER_CAPACITY), what)
        self.value = torch.where(first, value, self.value)
        self.what = torch.where(first, what, self.what)

    def check(self, world: int, last_good: LastGood) -> None:
        """Raise :class:`Diverged` on every process if any process saw a non-finite step (a host
        sync; under torchrun a collective, so every process must call it at the same steps)."""
        bad = (self.step >= 0).long().reshape(1)
        if world > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if not int(bad):
            return
        step = int(self.step)
        if step < 0:
            raise Diverged(f"train[{self.run}]: another process met a non-finite loss or gradient norm, or a "
                           f"readout past its capacity (the run diverged); {_hint(last_good)}")
        if int(self.what) == OVER_CAPACITY:
            said = last_good() if callable(last_good) else last_good
            raise _over_capacity(self.run, f"at step {step}", int(self.value), f"stopped, {said}")
        what = QUANTITIES[int(self.what)]
        raise Diverged(f"train[{self.run}]: the {what} is {float(self.value)} at step {step} (the run diverged); "
                       f"{_hint(last_good)}")


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor holding a NaN or an infinity (None if all are finite)."""
    for name, t in tensors.items():
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None
