"""Check a model directory *before* building the model: config.json and safetensors headers only.

A ``config.json`` is trusted to size the model that is then allocated, so a config saying
100,000 layers or a 10^9 vocabulary would allocate (or run for minutes) before a single weight
is read. Everything here reads only small things -- ``config.json`` (at most ``MAX_CONFIG_BYTES``)
and each safetensors file's header (its 8-byte little-endian length and the JSON that follows,
at most ``MAX_HEADER_BYTES``; no tensor data) -- and checks:

- the sizes in the config are within ``LIMITS`` (positive integers, at most the cap);
- the header is well formed: every tensor has a known dtype, a shape and data offsets that
  match that shape and lie inside the file; a sharded checkpoint's
  ``model.safetensors.index.json`` names only tensors its shards hold;
- the config agrees with the header: the token embedding is (vocab, hidden) and the layer
  indices present in the tensor names are exactly 0..layers-1;
- the parameters the config implies are no more than ``SIZE_FACTOR`` times those the files
  hold, and the files' tensors fit in the memory available where they are loaded.

Any problem is one line (``DataError`` or the caller's subclass) naming the file and the field.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from tadm.errors import DataError
from tadm.io import json_loads

MAX_CONFIG_BYTES = 1 << 20  # a config.json (a DiffusionGemma one is ~5 KB)
MAX_INDEX_BYTES = 64 << 20  # a model.safetensors.index.json (one line per tensor)
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
MAX_SHARDS = 4096
SIZE_FACTOR = 4  # the config may imply at most this many times the parameters the files hold
LIMITS = {  # sane upper bounds on every size a config may give
    "layers": 1024,
    "hidden": 1 << 16,
    "vocab": 1 << 24,
    "heads": 1024,
    "experts": 4096,
    "intermediate": 1 << 20,
    "seq_len": 1 << 20,
    "mlp_ratio": 64,
}
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
LAYER_INDEX = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|blocks))\.(\d+)\.")
NOT_TEXT = ("vision", "audio", "image")


@dataclass
class Header:
    """The tensors of one checkpoint (all shards): name -> shape, and what they hold."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # name -> the file holding it
    dtypes: dict[str, str] = field(default_factory=dict)  # name -> safetensors dtype ("F32", "BF16", ...)
    elements: int = 0
    nbytes: int = 0


def read_json(path: Path, limit: int = MAX_CONFIG_BYTES, error: type[DataError] = DataError) -> dict:
    """A JSON object from a file of at most `limit` bytes (one-line errors)."""
    if not path.is_file():
        raise error(f"{str(path)!r} does not exist")
    size = path.stat().st_size
    if size > limit:
        raise error(f"{str(path)!r} is {size} bytes, more than the {limit} a model config may have")
    try:
        raw = json_loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"{str(path)!r} is not valid JSON: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict):
        raise error(f"{str(path)!r} must hold a JSON object")
    return raw


def bounded(value: object, name: str, kind: str, where: str, error: type[DataError] = DataError) -> int:
    """`value` as a positive integer no larger than ``LIMITS[kind]``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{where}: {name} must be a positive integer, got {value!r}")
    if value > LIMITS[kind]:
        raise error(f"{where}: {name} = {value} exceeds the limit {LIMITS[kind]} (refused before building the model)")
    return value


def read_header(path: Path, error: type[DataError] = DataError
                ) -> tuple[dict[str, tuple[int, ...]], int, int, dict[str, str]]:
    """(name -> shape, total elements, total bytes) of one safetensors file, from its header only."""
    if not path.is_file():
        raise error(f"checkpoint weights {str(path)!r} do not exist")
    bad = f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?)"
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise error(f"{bad}: {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise error(f"{bad}: header length {n} exceeds the file ({size} bytes) or the limit {MAX_HEADER_BYTES}")
        text = f.read(n)
    try:
        header = json_loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise error(f"{bad}: its header is not JSON") from None
    if not isinstance(header, dict):
        raise error(f"{bad}: its header is not a JSON object")
    data_size = size - 8 - n
    shapes, elements, nbytes, dtypes = {}, 0, 0, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise error(f"{bad}: tensor {name!r} has no entry")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise error(f"{bad}: tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape):
            raise error(f"{bad}: tensor {name!r} has shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise error(f"{bad}: tensor {name!r} has data_offsets {offsets!r}")
        count = prod(shape)
        begin, end = offsets
        if not 0 <= begin <= end <= data_size or end - begin != count * DTYPE_BYTES[dtype]:
            raise error(f"{bad}: tensor {name!r} {dtype}{shape} has data_offsets {offsets} "
                        f"outside or unlike its {data_size} data bytes")
        shapes[name] = tuple(shape)
        dtypes[name] = dtype
        elements += count
        nbytes += end - begin
    return shapes, elements, nbytes, dtypes


def read_weights(directory: Path, error: type[DataError] = DataError) -> Header:
    """The headers of ``model.safetensors`` or of every shard ``model.safetensors.index.json`` lists."""
    single, index = directory / WEIGHTS_FILE, directory / INDEX_FILE
    out = Header()
    if single.is_file() or not index.is_file():
        out.shapes, out.elements, out.nbytes, out.dtypes = read_header(single, error)
        out.files = dict.fromkeys(out.shapes, single.name)
        return out
    raw = read_json(index, MAX_INDEX_BYTES, error)
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise error(f"{str(index)!r}: 'weight_map' must map tensor names to shard files")
    shards = sorted(set(weight_map.values()))
    if len(shards) > MAX_SHARDS:
        raise error(f"{str(index)!r}: {len(shards)} shards exceed the limit {MAX_SHARDS}")
    for shard in shards:
        if Path(shard).name != shard:
            raise error(f"{str(index)!r}: shard {shard!r} is not a file name in {directory}")
        shapes, elements, nbytes, dtypes = read_header(directory / shard, error)
        out.elements += elements
        out.nbytes += nbytes
        for name, shape in shapes.items():
            out.shapes[name] = shape
            out.files[name] = shard
            out.dtypes[name] = dtypes[name]
    for name, shard in weight_map.items():
        if out.files.get(name) != shard:
            raise error(f"{str(index)!r}: tensor {name!r} is not in its shard {shard!r}")
    return out


def layer_counts(names, pattern: re.Pattern = LAYER_INDEX) -> dict[str, list[int]]:
    """Layer-stack prefix -> sorted layer indices found in tensor names (vision / audio towers left out);
    `pattern` captures (prefix, index)."""
    found: dict[str, set[int]] = {}
    for name in names:
        m = pattern.match(name)
        if m and not any(word in m.group(1) for word in NOT_TEXT):
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {prefix: sorted(ix) for prefix, ix in found.items()}


def check_layers(stacks: dict[str, int], header: Header, where: str, error: type[DataError] = DataError) -> None:
    """Each layer stack `prefix` -> configured depth must hold exactly the indices 0..depth-1."""
    found = layer_counts(header.shapes)
    for prefix, depth in stacks.items():
        ix = found.get(prefix, [])
        if ix != list(range(depth)):
            have = f"{len(ix)} (indices {ix[0]}..{ix[-1]})" if ix else "0"
            raise error(f"{where}: {prefix} has {depth} layers in config.json but {have} in the weights")


def available_bytes(device=None) -> int | None:
    """Free memory where a model will live (a CUDA device's free memory, else the host's MemAvailable)."""
    if device is not None:
        try:
            from tadm.runtime import device_free_bytes  # lazy: tadm.runtime imports torch (~1.5 s); only the free-memory check needs it

            own, free = device_free_bytes(device)
            if own:
                return free
        except Exception:  # noqa: BLE001 - an unknown device: no memory check
            return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(nbytes: int, where: str, device=None, error: type[DataError] = DataError) -> None:
    free = available_bytes(device)
    if free is not None and nbytes > free:
        raise error(f"{where}: the model needs {nbytes / 2**30:.1f} GiB, only {free / 2**30:.1f} GiB is free "
                    f"on {device or 'the host'}")


# --------------------------------------------------------------------------- transformers directories


def _first(cfg: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return k, cfg[k]
    return None, None


HF_FIELDS = {  # kind -> the names transformers configs use for it
    "vocab": ("vocab_size",),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "experts": ("num_experts", "num_local_experts"),
    "intermediate": ("intermediate_size", "n_inner", "moe_intermediate_size"),
}
HF_REQUIRED = ("vocab", "hidden", "layers")


def check_hf_directory(directory: str | Path, what: str, dtype_bytes: int = 4, device=None) -> Header:
    """Check a transformers model directory (config.json + safetensors) before ``from_pretrained``.

    `what` names the model in errors ("evaluator 'x'"); `dtype_bytes` is the size of the
    precision it is loaded in, `device` where (None: the host)."""
    directory = Path(directory)
    path = directory / "config.json"
    raw = read_json(path)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    where = f"{what}: {path}"
    sizes = {}
    for kind, keys in HF_FIELDS.items():
        key, value = _first(text, keys)
        if key is None:
            if kind in HF_REQUIRED:
                raise DataError(f"{where}: lacks {' / '.join(keys)}")
            continue
        sizes[kind] = (key, bounded(value, key, kind, where))
    (vkey, vocab), (hkey, hidden), (lkey, layers) = sizes["vocab"], sizes["hidden"], sizes["layers"]
    if not (directory / WEIGHTS_FILE).is_file() and not (directory / INDEX_FILE).is_file():
        raise DataError(f"{what}: {directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE} (only safetensors are read)")
    header = read_weights(directory)
    weights = directory / (WEIGHTS_FILE if (directory / WEIGHTS_FILE).is_file() else INDEX_FILE)
    embeddings = [n for n in header.shapes if n.endswith(EMBEDDING_SUFFIXES) and not any(w in n for w in NOT_TEXT)]
    if not embeddings:
        raise DataError(f"{what}: {weights} has no token embedding ({' / '.join(EMBEDDING_SUFFIXES)})")
    shape = header.shapes[embeddings[0]]
    if len(shape) != 2 or shape[0] != vocab:
        raise DataError(f"{where}: {vkey} = {vocab} but {embeddings[0]} in {weights.name} is {shape}")
    ekey, edim = _first(text, ("embedding_size", "word_embed_proj_dim"))  # ALBERT / OPT: embeddings narrower
    if ekey is not None:
        edim = bounded(edim, ekey, "hidden", where)
    else:
        ekey, edim = hkey, hidden
    if shape[1] != edim:
        raise DataError(f"{where}: {ekey} = {edim} but {embeddings[0]} in {weights.name} is {shape}")
    stacks = layer_counts(header.shapes)
    # every text layer stack found (…layers.N. / h.N. / layer.N. / blocks.N.) holds exactly 0..layers-1;
    # a layout with none of these is bounded by the parameter count below only
    check_layers({prefix: layers for prefix in stacks}, header, f"{where}: {lkey}")
    # a lower bound on what the config implies: the embedding and one hidden x hidden matrix per layer
    implied = vocab * hidden + layers * hidden * hidden
    if implied > SIZE_FACTOR * header.elements:
        raise DataError(f"{where}: the config implies at least {implied} parameters, the weights hold {header.elements}")
    check_fits(header.elements * dtype_bytes, what, device)
    return header
