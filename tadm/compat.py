"""Version gates for the installed packages the project's code paths depend on.

The DiffusionGemma paths (tadm.posttrain backbone / objective / anchored / model,
tadm.caches.diffusiongemma, tadm.experiments.diffusiongemma) use transformers 5.24's names --
``cache`` where earlier releases said ``past_key_values`` -- and on an older transformers they
fail deep inside a forward or silently drop the cache. Those modules call
:func:`require_transformers` when imported, so an older release stops with one line naming both
versions before any model is built.
"""

from __future__ import annotations

from packaging.version import Version

from tadm.errors import DependencyError

MIN_TRANSFORMERS = "5.24"  # the first release with `cache=` (was `past_key_values=`) in DiffusionGemma
PINNED_TRANSFORMERS = "5.24.0"  # requirements/lock.txt, benchmarks/gpu_wheels.txt
WHEEL_HINT = (f"pip install --no-deps --no-index ./transformers-{PINNED_TRANSFORMERS}-py3-none-any.whl "
              "(offline: docs/gpus.md)")


def installed_transformers() -> str | None:
    """The version of the transformers that `import transformers` gets (None when there is none)."""
    try:
        import transformers  # lazy: transformers takes ~2 s to import (and may be missing); only the version gate asks
    except ImportError:
        return None
    return transformers.__version__


def transformers_problem(minimum: str = MIN_TRANSFORMERS, what: str = "DiffusionGemma paths") -> str | None:
    """None when the installed transformers is at least `minimum`; otherwise the one-line reason."""
    installed = installed_transformers()
    if installed is not None and Version(installed) >= Version(minimum):
        return None
    have = f"transformers {installed} is installed" if installed else "transformers is not installed"
    return f"{what} need transformers>={minimum} but {have}; {WHEEL_HINT}"


def require_transformers(minimum: str = MIN_TRANSFORMERS, what: str = "DiffusionGemma paths") -> str:
    """The installed transformers version, or DependencyError (one line) when it is older than `minimum`."""
    problem = transformers_problem(minimum, what)
    if problem:
        raise DependencyError(problem)
    return installed_transformers()
