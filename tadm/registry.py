"""Registries: one per concept, mapping a name (the value a params file gives) to its unit.

A unit registers itself when its module is imported; the registry knows which package holds its
units (`home`) and imports it before answering, so a params file is checked against the units
that exist, whatever was imported first. Name lists derive from the registry, never by hand:

    SAMPLERS = Registry("sampler", home="tadm.sampling")

    class MySampler(Sampler):          # tadm/sampling/my.py, imported by tadm/sampling/__init__.py
        names = ("my-sampler",)        # Sampler.__init_subclass__ calls SAMPLERS.register

    SAMPLERS.names()                   # (..., "my-sampler"): sample.sampler may now name it

A params field refers to a registry with ``spec(default, registry=SAMPLERS)``; the loader then
refuses any other value with one line naming the key and the registered names.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Iterator, Mapping


class Registry(Mapping[str, Any]):
    """Names of one concept (`concept`, e.g. "sampler") -> their units, filled on import of `home`."""

    def __init__(self, concept: str, home: str):
        self.concept, self.home = concept, home
        self._units: dict[str, Any] = {}
        self._listeners: list = []

    def subscribe(self, listener) -> None:
        """Call ``listener(name, unit)`` for every unit registered from now on (a place that
        mirrors the registry elsewhere, e.g. transformers' Auto classes, `tadm.auto`)."""
        self._listeners.append(listener)

    def register(self, name: str, unit: Any) -> None:
        """Add `unit` under `name`; a name registered twice by different units is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.concept} names must be non-empty strings, got {name!r}")
        known = self._units.get(name)
        if known is not None and known is not unit and known != unit and _label(known) != _label(unit):
            raise ValueError(f"{self.concept} {name!r} is registered twice: {_label(known)} and {_label(unit)}")
        self._units[name] = unit
        for listener in self._listeners:
            listener(name, unit)

    def unregister(self, name: str) -> Any:
        """Remove `name` (a test's own unit, once the test is done); returns its unit."""
        return self._units.pop(name)

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order (the home package imported first)."""
        import_module(self.home)
        return tuple(self._units)

    def __getitem__(self, name: str) -> Any:
        if name not in self._units:
            import_module(self.home)
        return self._units[name]

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.concept!r}: {', '.join(self._units)})"


def _label(unit: Any) -> str:
    """A unit's class path (a module re-imported registers the same path again), else its repr."""
    return getattr(unit, "__qualname__", None) or repr(unit)


SAMPLERS = Registry("sampler", home="tadm.sampling")
METHODS = Registry("method", home="tadm.methods")  # run names of train.models -> tadm.methods.base.Method
TABLE2_ROWS = Registry("Table 2 row", home="tadm.methods")  # row names -> tadm.methods.base.Row
# training-free caches, per base; their home registers each by name and builds it lazily (no torch)
DG_CACHES = Registry("DiffusionGemma cache", home="tadm.caches.catalog")  # -> tadm.caches.catalog.CacheMethod
LLADA_CACHES = Registry("LLaDA cache", home="tadm.caches.catalog")  # -> tadm.caches.catalog.LladaCache



def method_for(model_type: str) -> Any:
    """The unit of METHODS whose network is `model_type` (a loaded checkpoint's)."""
    units = dict.fromkeys(METHODS.values())
    for unit in units:
        if unit.model.model_type == model_type:
            return unit
    raise ValueError(f"no method trains model_type {model_type!r} (known: "
                     f"{', '.join(sorted({u.model.model_type for u in units}))})")


__all__ = ["Registry", "SAMPLERS", "METHODS", "TABLE2_ROWS", "DG_CACHES", "LLADA_CACHES", "method_for"]
