"""Loading helpers shared by the benchmarks: local JSON-lines files and lazy hub access."""

from __future__ import annotations

from typing import Any

from tadm.errors import DataError
from tadm.io import load_jsonl as read_jsonl  # noqa: F401  (re-exported for the benchmarks)


def _why(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_hub(name: str, config: str | None, split: str, data_files: Any = None) -> list[dict[str, Any]]:
    """A hub data set split as a list of dicts (``datasets`` is imported only here).

    With `data_files`, `name` is a packaged builder ("json") and `data_files` the files (hub
    ``hf://`` paths or local ones). A data set that cannot be loaded -- offline, a wrong id, a
    missing split -- is one DataError line naming it, never a traceback."""
    import datasets  # lazy: datasets takes ~0.9 s to import; only a hub data set needs it

    try:
        if data_files is not None:
            ds = datasets.load_dataset(name, data_files=data_files, split=split)
        else:
            ds = datasets.load_dataset(name, config, split=split) if config else datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets raises many types (ConnectionError, DatasetNotFoundError, ...)
        raise DataError(f"cannot load hub data set {name!r} (split {split!r}): {_why(e)}") from None
    return [dict(row) for row in ds]
