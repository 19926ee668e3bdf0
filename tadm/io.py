"""File helpers: atomic writes, content hashes, stage manifests.

Every stage output is written to a temporary sibling and renamed into place, so an
interrupted stage never leaves a partial file that looks finished. Manifests hold counts and
SHA-256 hashes of the outputs and no timestamps, so re-running a stage gives identical bytes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from tadm.errors import ConfigError, DataError

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def sha256_tree(path: str | Path) -> dict[str, str]:
    """Hash of every file under `path` (relative posix path -> sha256), sorted."""
    path = Path(path)
    if path.is_file():
        return {path.name: sha256_file(path)}
    return {
        p.relative_to(path).as_posix(): sha256_file(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def free_space(path: str | Path) -> str:
    """The free space on `path`'s disk (its nearest existing ancestor), in a few words."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 2 ** 20:,.0f} MiB free on its disk"
    except OSError:
        return "free space unknown"


def probe_writable(directory: Path) -> None:
    """Make `directory` (with its parents) and write and remove one file in it; OSError if either
    fails."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-probe-")
    os.close(fd)
    os.unlink(probe)


def require_writable(dirs: dict[str, str | Path], before: str) -> None:
    """Each directory ({what: path}) exists or can be made, and takes a new file: probed before
    `before` starts, so that a read-only or missing output place is one line at the start, not a
    traceback after the work. Raises DataError naming the directory."""
    for what, directory in dirs.items():
        directory = Path(directory)
        try:
            probe_writable(directory)
        except OSError as e:
            raise DataError(f"{directory}: cannot write the {what} there ({e.strerror or e}; {free_space(directory)}); "
                            f"nothing was done: make it writable before {before}") from None


# ------------------------------------------------------------------------- output paths

# the files `save_pretrained` of a transformers model and tokenizer write (any version this project
# pins or pinned): a folder holding only these (and the writer's own names) is a saved model or
# tokenizer that its writer may replace on a rerun
HF_SAVED_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
                  "model.safetensors.index.json", "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
                  "tokenizer.model", "chat_template.jinja", "chat_template.json")


def _kind_of(path: Path) -> str | None:
    """"dir" (a folder; a symbolic link to one is no folder here), "file" (anything else there,
    a symbolic link included: replacing it leaves its target alone), None (nothing there)."""
    if path.is_dir() and not path.is_symlink():
        return "dir"
    if path.is_symlink() or path.exists():
        return "file"
    return None


def _files_under(folder: Path) -> list[str]:
    """Every file under `folder` (relative posix paths, sorted); a symbolic link counts as a file,
    an empty subfolder as nothing."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if not (p.is_dir() and not p.is_symlink()))


def _listing(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def output_conflict(path: str | Path, kind: str = "file", ours: tuple[str, ...] | None = None) -> str | None:
    """Why writing a `kind` ("file" or "dir") at `path` would remove what its writer did not
    create, in a few words naming `path`; None when it would not.

    A file is refused over an existing folder, a folder over an existing file. With `ours` (the
    folder is written as a whole and replaces the one there: :func:`atomic_path`), an existing
    folder is refused unless every file under it matches one of the patterns `ours` (fnmatch on
    its posix path relative to the folder: the names this writer writes), an empty one always
    allowed. Without `ours` the folder is written into, not replaced: any existing folder is fine.
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    path = Path(path)
    there = _kind_of(path)
    if there is None:
        return None
    if kind == "file":
        if there != "dir":
            return None
        held = _files_under(path)
        holding = f"holding {_listing(held)}" if held else "empty"
        return f"{path} is an existing folder ({holding}), where a file is to be written: the file would replace it"
    if there == "file":
        return f"{path} is an existing file, where a folder is to be written"
    if ours is None:
        return None
    foreign = [name for name in _files_under(path) if not any(fnmatch.fnmatchcase(name, pat) for pat in ours)]
    if foreign:
        return (f"{path} is an existing folder holding {_listing(foreign)}, which this output does not write: "
                "replacing the folder would delete them")
    return None


def check_output_path(path: str | Path, kind: str = "file", what: str = "--out", source: str = "python -m tadm",
                      ours: tuple[str, ...] | None = None) -> Path:
    """Refuse, before any work, an output path whose write would remove what the caller did not
    create (:func:`output_conflict`): a :class:`~tadm.errors.ConfigError` line naming the flag or
    parameter `what` (of the command or notebook `source`) and the path. Returns ``Path(path)``."""
    why = output_conflict(path, kind, ours) or unwritable(path)
    if why is not None:
        raise ConfigError(what, f"{why}; refused, nothing was done: name another path, or move it away yourself", source)
    return Path(path)


def unwritable(path: str | Path) -> str | None:
    """Why nothing can be written at `path`, probed now rather than found after the work: its
    nearest existing folder must take a new file (a temporary one is made there and removed at
    once); None when it does. /proc, /sys and a read-only or full disk fail the probe."""
    folder = Path(path).expanduser().absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{path} cannot be written: {folder} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".tadm-probe-", dir=folder)
    except OSError as e:
        return f"{path} cannot be written: {folder} takes no new file ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def check_output_paths(paths: dict[str, tuple[Any, str]], source: str) -> None:
    """:func:`check_output_path` for each ``{name: (path or None, kind)}`` (None: no output)."""
    for name, (value, kind) in paths.items():
        if value is not None:
            check_output_path(value, kind, name, source)


@contextlib.contextmanager
def atomic_path(path: str | Path, kind: str = "file", ours: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it onto `path`.

    Works for files (`kind` "file") and directories ("dir": the caller makes the folder at the
    yielded path and fills it). On error the temporary is removed and any previous `path` is
    left untouched. A parent that cannot be created or written (a file in the way, no
    permission, /proc) is a one-line DataError naming it.

    Nothing its caller did not create is removed: checked on entry (before the work) and again,
    against what the caller made, just before the rename, each a one-line DataError naming
    `path` with nothing changed:

    * a file never replaces a folder, nor a folder a file (a symbolic link counts as a file:
      replacing it leaves its target alone);
    * a folder replaces an existing folder only when that folder is empty or every file under
      it matches one of the patterns `ours` (fnmatch on its posix path relative to the folder):
      the names this writer writes, so that a rerun replaces its own previous output and
      nothing else (:data:`HF_SAVED_FILES` for a saved model or tokenizer).
    """
    path = Path(path)
    ours = tuple(ours)

    def refuse_conflict(made: str) -> None:
        why = output_conflict(path, made, ours if made == "dir" else None)
        if why is not None:
            raise DataError(f"{why}; refused, it is left as it is: name another path, or move it away yourself")

    refuse_conflict(kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as e:  # an output directory that cannot be made or written: one line, not a traceback
        raise DataError(f"{path.parent}: cannot write {path.name} there ({e.strerror or e}); "
                        "choose a writable output directory") from None
    target = tmp / path.name
    try:
        yield target
        refuse_conflict(_kind_of(target) or kind)
        if _kind_of(path) == "dir":  # a folder over a folder (allowed by the rule above): swap, then remove
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(target, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, rows) -> int:
    """Write rows (dicts) as JSON lines atomically; return the row count."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def write_manifest(out_dir: str | Path, stage: str, counts: dict, params: dict | None = None,
                   files: list[str | Path] | None = None) -> dict:
    """Write ``<out_dir>/manifest.json``: stage name, counts, params and file hashes.

    `files` defaults to every file under `out_dir`. Paths are stored relative to `out_dir`.
    """
    out_dir = Path(out_dir)
    if files is None:
        hashes = sha256_tree(out_dir)
    else:
        hashes = {Path(f).relative_to(out_dir).as_posix(): sha256_file(f) for f in sorted(map(Path, files))}
    manifest = {"stage": stage, "counts": counts, "params": params or {}, "sha256": hashes}
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
               dict: "an object", type(None): "null"}


def _type_name(t) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join(_TYPE_NAMES.get(x, x.__name__) for x in ts)


def _check_row(row: Any, schema, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    keys = schema if isinstance(schema, dict) else dict.fromkeys(schema)
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    for k, t in keys.items():
        if t is None:
            continue
        v = row[k]
        ts = t if isinstance(t, tuple) else (t,)
        ok = isinstance(v, ts) and not (isinstance(v, bool) and bool not in ts)  # JSON true is no number
        if float in ts and isinstance(v, int) and not isinstance(v, bool):
            ok = True
        if not ok:
            raise DataError(f"{where}: field {k!r} must be {_type_name(t)}, got {type(v).__name__} {str(v)[:40]!r}")
    return row


def read_jsonl(path: str | Path, schema=(), hint: str = "") -> Iterator[dict]:
    """Stream the rows of a JSON-lines file, each checked as it is read.

    Every row must be a JSON object holding the keys of `schema` (a tuple of keys, or a dict
    key -> type or tuple of types, None for any type). Blank lines are skipped. A bad line
    raises DataError ``FILE:LINE: what is wrong`` (then ``; hint`` when given, e.g. the stage to
    rerun); a missing file ``FILE: file not found``.
    """
    path = Path(path).expanduser()
    tail = f"; {hint}" if hint else ""
    if not path.is_file():
        raise DataError(f"{path}: file not found{tail}")
    with open(path, "rb") as f:  # bytes: a decoding error is then placed on its line
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at column {e.start + 1}){tail}") from None
            if not line.strip():
                continue
            try:
                row = json_loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno}){tail}") from None
            try:
                row = _check_row(row, schema, f"{path}:{lineno}")
            except DataError as e:
                raise DataError(f"{e}{tail}") from None
            yield row


def load_jsonl(path: str | Path, required=()) -> list[dict]:
    """The rows of a JSON-lines file (checked as by :func:`read_jsonl`); at least one.

    Raises DataError naming the file (and line) when the file is missing, empty, not JSON, or
    a row lacks a required key or holds one of the wrong type.
    """
    rows = list(read_jsonl(path, required))
    if not rows:
        raise DataError(f"{Path(path).expanduser()}: file holds no rows")
    return rows


def json_loads(text: str | bytes):
    """``json.loads`` for files from outside (corpus lines, configs, headers, manifests): a value
    nested deeper than the interpreter's recursion limit is a :class:`json.JSONDecodeError` (a
    ValueError, as for any invalid JSON), which every reader turns into its one-line error,
    instead of a RecursionError traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
        raise json.JSONDecodeError("nested too deeply (arrays or objects deeper than the interpreter's "
                                   "recursion limit)", doc[:64], 0) from None


# --------------------------------------------------------------------------- manifests on read


MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def read_regular_text(path: Path, limit: int, error: type[Exception] = DataError) -> str:
    """The UTF-8 text of `path`, which must be a regular file of at most `limit` bytes (a FIFO,
    a device such as /dev/zero or a directory is one `error` line, never a blocking or endless
    read). Symbolic links are followed: DVC's `symlink` cache type links every output."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"{path}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a regular file")
        if st.st_size > limit:
            raise error(f"{path}: {st.st_size} bytes, more than the {limit} allowed")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason})") from None


def read_manifest(directory: str | Path, stage: str, hint: str) -> dict:
    """``<directory>/manifest.json`` written by `stage`, checked for shape; `hint` says how to
    make it (e.g. ``dvc repro pack``)."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        raise DataError(f"{path}: missing; {hint}")
    text = read_regular_text(path, MAX_MANIFEST_BYTES)
    try:
        m = json_loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e}); {hint}") from None
    if not isinstance(m, dict) or not all(isinstance(m.get(k), dict) for k in ("counts", "params", "sha256")):
        raise DataError(f"{path}: not a stage manifest (needs objects counts, params, sha256); {hint}")
    if m.get("stage") != stage:
        raise DataError(f"{path}: written by stage {m.get('stage')!r}, expected {stage!r}; {hint}")
    return m


_HASHES: dict[tuple, str] = {}  # (path, size, mtime_ns, inode) -> sha256: each file hashed once per process


def file_identity(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


def cached_sha256(path: Path) -> str:
    key = file_identity(path)
    if key not in _HASHES:
        _HASHES[key] = sha256_file(path)
    return _HASHES[key]


def check_hash(directory: Path, name: str, manifest: dict, hint: str, digest: str | None = None) -> None:
    """File `name` under `directory` exists and its SHA-256 (`digest`, else computed once per
    process) is the manifest's."""
    path = Path(directory) / name
    want = manifest["sha256"].get(name)
    if want is None:
        raise DataError(f"{path}: not listed in {Path(directory) / 'manifest.json'}; {hint}")
    if not path.is_file():
        raise DataError(f"{path}: missing (listed in {Path(directory) / 'manifest.json'}); {hint}")
    got = digest if digest is not None else cached_sha256(path)
    if got != want:
        raise DataError(f"{path}: sha256 differs from manifest.json (file changed since the "
                        f"{manifest['stage']} stage wrote it); {hint}")


def check_jsonl_input(path: str | Path, stage: str, hint: str) -> Path:
    """A stage's JSON-lines input checked against the manifest of the stage that wrote it (the
    manifest in the same directory): listed, present, same SHA-256."""
    path = Path(path).expanduser()
    m = read_manifest(path.parent, stage, hint)
    check_hash(path.parent, path.name, m, hint)
    return path
