"""The field helper every section uses: a default plus validation rules (checked by the loader)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def spec(default: Any, **rules: Any) -> Any:
    """A dataclass field with a default and validation rules in its metadata
    (ge, gt, le, lt, length, nonempty, unique, path_unless, registry; see `_check_rules`). The default is for
    code that builds a section directly; a params file must still set the key, unless the
    rules say ``optional=True`` (only a few per-entry fields of list records)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=rules)
    return field(default=default, metadata=rules)
