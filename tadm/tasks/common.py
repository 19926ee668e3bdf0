"""Loading helpers shared by the benchmarks: local JSON-lines files and lazy hub access."""

from __future__ import annotations

from typing import Any

from tadm.io import load_jsonl as read_jsonl  # noqa: F401  (re-exported for the benchmarks)


def load_hub(name: str, config: str | None, split: str) -> list[dict[str, Any]]:
    """A hub data set split as a list of dicts (``datasets`` is imported only here)."""
    import datasets

    ds = datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
    return [dict(row) for row in ds]
