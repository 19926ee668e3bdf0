"""Table 1's timing blocks across processes: where timing block b's record lies
(results/table1_speed/block_<b>.json) and its format, each block's sampling seed and prompt-batch
window, the settings a block must share with the run that combines it, loading those blocks, and
combining each row's speed-up over the scored pass and the blocks (`tadm.metrics.invocations`).
The blocks themselves are timed by `tadm.experiments.table1.time_block`."""

from __future__ import annotations

import json
from pathlib import Path

from tadm.config import Params
from tadm.errors import DataError

SPEED_DIR = Path("results/table1_speed")
SPEED_FORMAT = 1
SPEED_SEED = 10_000  # timing block b's sampling seed is SPEED_SEED + b: no scored pass uses it


def speed_block_path(block: int, directory: str | Path = SPEED_DIR) -> Path:
    return Path(directory) / f"block_{int(block)}.json"


def speed_starts(n: int, batch_size: int, block: int, blocks: int, count: int) -> list[int]:
    """The first examples of timing block `block`'s prompt batches: `count` consecutive full
    batches (of `batch_size`; the first batch when none is full), the blocks' windows spread evenly
    over the task's full batches (block 1 from the first, the last block ending at the last)."""
    full = [lo for lo in range(0, n, batch_size) if lo + batch_size <= n] or [0]
    k = min(count, len(full))
    first = round((block - 1) * (len(full) - k) / (blocks - 2)) if blocks > 2 else 0
    return full[first: first + k]


def _speed_signature(p: Params, methods: list) -> dict:
    pt = p.posttrain
    return {"methods": [m.label for m in methods], "tasks": list(pt.tasks), "eval_batch_size": pt.eval_batch_size,
            "sample_steps": pt.sample_steps, "canvas_length": pt.canvas_length, "eval_examples": pt.eval_examples,
            "max_new_tokens": pt.max_new_tokens}


def load_speed_blocks(p: Params, methods: list, directory: str | Path) -> list[dict]:
    """Timing blocks 1..timing.table1_blocks - 1 from `directory`, each checked to time this
    run's methods and tasks in its settings; a one-line DataError naming the file otherwise."""
    want, out = _speed_signature(p, methods), []
    for b in range(1, p.timing.table1_blocks):
        path = speed_block_path(b, directory)
        if not path.is_file():
            raise DataError(f"{path} is missing: Table 1's speed combines timing.table1_blocks="
                            f"{p.timing.table1_blocks} timing blocks (run `dvc repro table1_speed` or "
                            f"`python -m tadm table1-speed --block {b}`; the notebook's speed_blocks_dir '' times "
                            "the scored pass alone)")
        block = json.loads(path.read_text())
        if block.get("format") != SPEED_FORMAT or block.get("blocks") != p.timing.table1_blocks:
            raise DataError(f"{path}: format {block.get('format')!r} of {block.get('blocks')!r} blocks, this run reads "
                            f"format {SPEED_FORMAT} of {p.timing.table1_blocks}: rerun `dvc repro table1_speed`")
        for k, v in want.items():
            if block.get(k) != v:
                raise DataError(f"{path} was timed with {k} {block.get(k)!r}, this run has {v!r}: rerun "
                                "`dvc repro table1_speed` at these settings (the notebook's speed_blocks_dir '' times "
                                "the scored pass alone)")
        out.append(block)
    return out


def combine_speed(rows: dict[str, dict], task: str, blocks: list[dict]) -> None:
    """Each row's throughput_x of one task, from the scored pass (block 0, its paired speed-up)
    and the timing blocks combined (`tadm.metrics.invocations.combine`): exp(mean of the blocks'
    log ratios) ± their se on B - 1 df (throughput_df; never below the within-block part); the scored pass's own figure kept as
    throughput_x_scored, every block's in speed_blocks."""
    from tadm.metrics import invocations  # lazy: tadm.metrics imports torch (~1.5 s); `tadm table1-speed`'s output check loads this module

    for label, row in rows.items():
        per = [(row["throughput_x"], row.get("throughput_se"))]
        per += [(b["results"][task]["methods"][label]["throughput_x"], b["results"][task]["methods"][label]["throughput_se"])
                for b in blocks]
        c = invocations.combine([x for x, _ in per], [se for _, se in per])
        row["throughput_x_scored"], row["throughput_se_scored"] = row["throughput_x"], row.get("throughput_se")
        row["throughput_x"], row["throughput_se"], row["throughput_df"] = c["ratio"], c["se"], c["df"]
        row["speed_blocks"] = c
