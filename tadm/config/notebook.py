"""Notebook parameters, checked like params.yaml keys.

papermill hands a notebook its parameters as Python values it guessed from the command line
(``-p K 2.7`` a float, ``-p K True`` a bool, ``-p seeds 5`` an int, ``-p seeds abc`` a string);
``-y`` / ``-r`` pass YAML or Python literals, which is how a list arrives. Each notebook checks
its parameters here, against the params key it stands for (its type, range and list-ness: the
rules of :mod:`tadm.config`, with the same one-line :class:`~tadm.errors.ConfigError`), before
anything runs: nothing is truncated (``int(2.7)``), nothing iterated character by character
(``list("abc")``)::

    p = notebook.load(params_file, profile)
    K = notebook.parameter("K", K, "sample.budgets.K")   # as the K of a budget
    T = notebook.parameter("T", T, "sample.replicate_steps", entry=True)   # as one entry of that list
    p = notebook.apply(p, {"sample.batch_size": ("batch_size", batch_size)})

A notebook's output paths default under ``scratch/`` and :func:`check_outputs` refuses one that
is, holds or lies inside an output of the pipeline (``dvc.yaml`` in the working directory), unless
the notebook runs as a ``dvc repro`` stage (DVC sets ``DVC_STAGE``): a notebook run by hand never
writes over what ``dvc repro`` made.

A notebook's ``profile`` parameter (None: the params file's) is honoured only as a check: a
params file of another profile is refused, never run under the profile's name.

:func:`one_line_errors` makes a ``TadmError`` raised in a notebook cell show as its one line
(the cell's error output, no traceback); ``python -m tadm.papermill_cli`` (the pipeline's
papermill) then prints that line and exits 2.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import typing
from pathlib import Path
from typing import Any, Optional

import yaml

from tadm.config.loader import _check_rules, _convert, _type_name, load as load_params, override
from tadm.config.params import Params
from tadm.errors import ConfigError, TadmError

SOURCE = "notebook parameter"
_LIST_RULES = ("nonempty", "length", "unique")  # rules of a list as a whole, not of one entry


def _field(key: str) -> tuple[Any, dict]:
    """The annotation and rules of the params key `key` (dotted; through a list of records,
    ``sample.budgets.K`` is the K of any one budget)."""
    cls: Any = Params
    *sections, leaf = key.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
        if typing.get_origin(cls) is list:
            (cls,) = typing.get_args(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if leaf not in fields:
        raise KeyError(f"no params key {key!r}")
    return typing.get_type_hints(cls)[leaf], dict(fields[leaf].metadata)


def field_type(key: str, *, entry: bool = False) -> Any:
    """The annotation of the params key `key` (`entry`: of one entry of that list key)."""
    tp, _ = _field(key)
    if entry:
        (tp,) = typing.get_args(tp)
    return tp


def parameter(name: str, value: Any, key: Optional[str] = None, *, entry: bool = False, tp: Any = None,
              **rules: Any) -> Any:
    """Notebook parameter `name` checked as the params key `key` (its type and rules; `entry`:
    as one entry of that list key) or as the annotation `tp`, with `rules` added (ge, gt, le,
    lt, nonempty, unique, ...); returned in canonical form (an int for a float key becomes a
    float). None (the notebook's "use the params file") passes through unchecked."""
    if value is None:
        return None
    own: dict = {}
    if key is not None:
        tp, own = _field(key)
        if entry:
            (tp,) = typing.get_args(tp)
            own = {k: v for k, v in own.items() if k not in _LIST_RULES}
    if tp is None:
        raise TypeError(f"parameter {name!r}: give the params key it stands for or its type")
    own.pop("path_unless", None)  # a path parameter is checked where it is opened
    if typing.get_origin(tp) is list and not isinstance(value, list):
        raise ConfigError(name, f"expected {_type_name(tp)}, got {value!r} (papermill: pass a list as YAML, "
                          f"-y '{name}: [...]')", SOURCE)
    value = _convert(value, tp, name, SOURCE)
    _check_rules(value, {**own, **rules}, name, SOURCE)
    return value


def apply(params: Params, changes: dict[str, tuple[str, Any]]) -> Params:
    """`params` with each dotted key set to a notebook parameter's value, ``{key: (name, value)}``
    (None values skipped): each value checked as its key (:func:`parameter`), then the whole
    validated like a params file; a cross-key error about one of these keys (a K beyond
    sample_steps, a device name) names the parameter too."""
    values = {key: parameter(name, value, key) for key, (name, value) in changes.items()}
    names = {key: name for key, (name, value) in changes.items() if value is not None}
    try:
        return override(params, values, source=SOURCE)
    except ConfigError as e:
        key = re.sub(r"\[\d+\]$", "", e.key)
        if key in names:
            raise ConfigError(f"{names[key]} (as {key})", e.detail, SOURCE) from None
        raise


def load(params_file: str | Path, profile: Optional[str] = None) -> Params:
    """The params file a notebook runs on; `profile` (the notebook's parameter; None: any) must
    be the file's own profile: a notebook does not switch profiles."""
    if profile is not None and not isinstance(profile, str):
        raise ConfigError("profile", f"expected a profile name, got {profile!r}", SOURCE)
    p = load_params(params_file)
    if profile is not None and profile != p.profile:
        raise ConfigError("profile", f"{profile!r}, but {params_file} holds profile {p.profile!r}; a notebook "
                          f"runs the params file it is given: render that profile first (python -m tadm profile "
                          f"{profile}) or pass -p params_file of it", SOURCE)
    return p


PIPELINE_FILE = "dvc.yaml"
STAGE_ENV = "DVC_STAGE"  # set by dvc for the command of every stage it runs


def pipeline_outputs(root: str | Path = ".") -> dict[str, str]:
    """Every output path (outs, metrics, plots) of the pipeline in `root`/dvc.yaml, mapped to its
    stage; a ``foreach`` stage's ``${...}`` is a wildcard. No dvc.yaml: no outputs."""
    f = Path(root) / PIPELINE_FILE
    if not f.is_file():
        return {}
    outs: dict[str, str] = {}
    for name, stage in (yaml.safe_load(f.read_text()) or {}).get("stages", {}).items():
        body = stage.get("do", stage)
        for kind in ("outs", "metrics", "plots"):
            for entry in body.get(kind) or []:
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                outs[re.sub(r"\$\{[^}]*\}", "*", str(path))] = name
    return outs


def _overlaps(parts: tuple[str, ...], pattern: str, kind: str) -> bool:
    """True when the path `parts` is the output `pattern`, lies inside it, or (a folder) holds it."""
    out = Path(pattern).parts
    if kind == "file" and len(parts) < len(out):
        return False
    n = min(len(parts), len(out))
    return all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts[:n], out[:n]))


def check_outputs(paths: dict[str, tuple[Any, str]], root: str | Path = ".") -> None:
    """A notebook's output paths, ``{parameter: (path or None, "file" | "dir")}``, before any work:
    :func:`tadm.io.check_output_paths` (nothing written over what is there), then each refused
    in one line when it is, holds or lies inside an output of the pipeline in `root`, unless this
    run is a stage of ``dvc repro`` itself."""
    # lazy: tadm.io (~13 ms) only for a notebook's outputs; `python -m tadm --help` loads this module
    from tadm.io import check_output_paths

    check_output_paths(paths, SOURCE)
    _check_pipeline(paths, root)


def _check_pipeline(paths: dict[str, tuple[Any, str]], root: str | Path = ".") -> None:
    """The pipeline half of :func:`check_outputs`."""
    if os.environ.get(STAGE_ENV):
        return
    outs = pipeline_outputs(root)
    base = Path(root).resolve()
    for name, (value, kind) in paths.items():
        if value is None:
            continue
        try:
            parts = Path(value).resolve().relative_to(base).parts
        except ValueError:  # outside the project: not the pipeline's
            continue
        for pattern, stage in outs.items():
            if _overlaps(parts, pattern, kind):
                raise ConfigError(name, f"{str(value)!r} would write over the pipeline's output {pattern} "
                                  f"(dvc.yaml stage {stage}); pass a path outside the pipeline's outputs "
                                  f"(the default is under scratch/)", SOURCE)


def one_line_errors() -> None:
    """In an IPython kernel (a notebook run by papermill or Jupyter): show a TadmError raised by a
    cell as ``<ErrorClass>: <its one line>``, without the traceback; the cell still fails.
    Outside IPython: nothing."""
    try:
        from IPython import get_ipython  # lazy: IPython (~0.1 s) is needed only inside a notebook kernel (absent: nothing to do)
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def show(shell, etype, value, tb, tb_offset=None):  # IPython's CustomTB handler: it shows the error itself
        shell._showtraceback(etype, value, [one_line(etype.__name__, value)])

    shell.set_custom_exc((TadmError,), show)


def one_line(ename: str, evalue: Any) -> str:
    """The error output of a TadmError in a notebook (:func:`one_line_errors`); the pipeline's
    papermill (tadm.papermill_cli) knows a failed cell by it."""
    return f"{ename}: {evalue}"
