"""Batches of a metric split over the processes of a run, put back in order.

The metrics cut their inputs into batches the same way whatever the number of processes (the
cut depends only on the inputs and the batch size); with a `tadm.runtime.Dist` of world N,
process r computes batches r, r + N, r + 2N, ... (`runtime.shard`) and every process receives
every batch's output in batch order (`runtime.gather`). Each batch is then computed exactly as
a single process computes it, so per-text values are the same bits for 1 and N processes (on
the same kind of device). Outputs must be host values (floats, lists, numpy arrays).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from tqdm import tqdm

from tadm import runtime


def map_batches(batches: Sequence[Any], fn: Callable[[Any], Any], dist: runtime.Dist | None = None, *,
                desc: str = "", progress: bool = False) -> list[Any]:
    """[fn(b) for b in batches], each computed by one process of `dist`, on every process."""
    world = 1 if dist is None else dist.world
    mine = list(range(len(batches))) if world == 1 else runtime.shard(len(batches), dist)
    show = progress and (dist is None or dist.main)
    out = [fn(batches[i]) for i in tqdm(mine, desc=desc, unit="batch", disable=not show)]
    return out if world == 1 else runtime.gather(out, len(batches), dist)


__all__ = ["map_batches"]
