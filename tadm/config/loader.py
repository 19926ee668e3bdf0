"""Loading a params file: each section built from its mapping and validated, the cross-key
checks, profiles rendered into ``params.yaml``, dotted-key overrides (module docstring of
:mod:`tadm.config` for the rules)."""

from __future__ import annotations

import dataclasses
import glob
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from tadm.config.asrd import AsrdConfig
from tadm.config.data import CorpusConfig, SftConfig, TokenizerConfig
from tadm.config.params import Params, RuntimeConfig
from tadm.config.posttrain import PosttrainConfig
from tadm.config.pretrain import ModelConfig, TrainConfig
from tadm.config.reading import read_yaml
from tadm.config.sampling import SampleConfig, TrainedEvaluatorConfig
from tadm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = ROOT / "profiles"
PARAMS_FILE = ROOT / "params.yaml"


# --------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping to {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters (a bad value can be a large structure)."""
    if isinstance(value, (list, dict)):
        kind = "list" if isinstance(value, list) else "mapping"
        return f"a {kind} of {len(value)} entries"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# what YAML 1.1 leaves a string although it is a number: exponent notation without a dot (3e-4, 1E+5)
_YAML11_FLOAT = re.compile(r"^[-+]?\d+[eE][-+]?\d+$")


def _convert(value: Any, tp: Any, key: str, source: str, profile: Optional[str] = None) -> Any:
    """Check `value` against the annotation `tp` and return it in canonical form."""

    def bad() -> ConfigError:
        got = repr(value) if _small(value) else _short_repr(value)
        return ConfigError(key, f"expected {_type_name(tp)}, got {got}", source)

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, inner, key, source, profile)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad()
        return value
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        (inner,) = typing.get_args(tp)
        return [_convert(v, inner, f"{key}[{i}]", source, profile) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        _, inner = typing.get_args(tp)
        return {str(k): _convert(v, inner, f"{key}.{k}", source, profile) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, key, source, profile)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` as a string; a quoted '0.5' is a string meant
            if not _YAML11_FLOAT.match(value):
                raise bad()
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        if not math.isfinite(value):
            raise ConfigError(key, f"must be finite, got {value!r}", source)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _check_rules(value: Any, rules: dict, key: str, source: str) -> None:
    if rules.get("nonempty") and (value is None or len(value) == 0):
        raise ConfigError(key, "must not be empty", source)
    if "length" in rules and len(value) != rules["length"]:
        raise ConfigError(key, f"must have exactly {rules['length']} entries, got {len(value)}", source)
    if rules.get("unique") and len(set(value)) != len(value):
        raise ConfigError(key, f"must not repeat a value, got {value}", source)
    items = value if isinstance(value, list) else [value]
    for i, v in enumerate(items):
        name = f"{key}[{i}]" if isinstance(value, list) else key
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        for op, test, word in (
            ("ge", lambda a, b: a >= b, ">="),
            ("gt", lambda a, b: a > b, ">"),
            ("le", lambda a, b: a <= b, "<="),
            ("lt", lambda a, b: a < b, "<"),
        ):
            if op in rules and not test(v, rules[op]):
                raise ConfigError(name, f"must be {word} {rules[op]}, got {v!r}", source)
    registry = rules.get("registry")
    if registry is not None:
        for i, v in enumerate(items):
            if v not in registry:
                name = f"{key}[{i}]" if isinstance(value, list) else key
                raise ConfigError(name, f"no {registry.concept} {v!r} is registered (known: {', '.join(registry.names())})",
                                  source)
    if "path_unless" in rules and value is not None and value not in rules["path_unless"]:
        if not Path(value).expanduser().exists():
            allowed = ", ".join(repr(a) for a in rules["path_unless"])
            raise ConfigError(key, f"file or directory {value!r} does not exist (or use {allowed} or null)", source)


def _small(value: Any) -> bool:
    """True when repr(value) is short enough for a one-line message."""
    if isinstance(value, (list, dict)):
        return len(value) <= 8 and all(not isinstance(v, (list, dict)) for v in
                                       (value.values() if isinstance(value, dict) else value))
    return len(repr(value)) <= 80


def _missing(cls: type, raw: dict, prefix: str, source: str, profile: Optional[str]) -> ConfigError:
    """The one-line error for keys of `cls` absent from `raw` (the first named, the rest counted)."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in raw and not f.metadata.get("optional")]
    dotted = [f"{prefix}.{n}" if prefix else n for n in names]
    first = dotted[0]
    is_section = dataclasses.is_dataclass(typing.get_type_hints(cls)[names[0]])
    msg = "missing section" if is_section else "missing key"
    if len(dotted) > 1:
        shown = ", ".join(dotted[1:4]) + (", ..." if len(dotted) > 4 else "")
        msg += f" (and {len(dotted) - 1} more: {shown})"
    msg += "; a params file must set every key, nothing falls back to a built-in default"
    hint = _profile_value(profile, first)
    if hint is not None:
        msg += f"; profile {profile!r} sets {first}: {hint} (`python -m tadm profile {profile}` renders a complete file)"
    elif not prefix or source.startswith("profiles/"):
        msg += " (`python -m tadm profile default` renders a complete file)"
    return ConfigError(first, msg, source)


def _profile_value(profile: Optional[str], dotted: str) -> Optional[str]:
    """How the rendered profile `profile` sets `dotted` (short text), or None if it cannot tell."""
    if not isinstance(profile, str) or profile not in available_profiles():
        return None
    try:
        node: Any = merged_profile(profile)
    except ConfigError:
        return None
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, dict):
        return "a section" if node else "{}"
    return repr(node) if _small(node) else _short_repr(node)


def _build(cls: type, raw: dict, prefix: str, source: str, profile: Optional[str] = None) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in fields:
            allowed = ", ".join(fields)
            where = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(where, f"unknown key; allowed keys here: {allowed}", source)
    if any(name not in raw and not f.metadata.get("optional") for name, f in fields.items()):
        raise _missing(cls, raw, prefix, source, profile)
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in raw:
            continue  # an optional per-entry field (metadata optional=True): its default applies
        value = _convert(raw[name], hints[name], key, source, profile)
        _check_rules(value, dict(f.metadata), key, source)
        kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(_CROSS_CHECKS, cls.__name__, None)
    if check is not None:
        check(obj, prefix, source)
    return obj


def _refuse_first(bad: list, key: str, why, source: str) -> None:
    """A ConfigError on `key` naming the first value of `bad` (`why(value)` says what is wrong
    with it), if there is one: the cross-checks' "every entry of this list must ..." rules."""
    if bad:
        raise ConfigError(key, why(bad[0]), source)


class _CROSS_CHECKS:
    """Constraints that involve several keys of one section."""

    @staticmethod
    def RuntimeConfig(c: RuntimeConfig, p: str, src: str) -> None:
        if not re.match(r"^(auto|cpu|cuda|cuda:\d+)$", c.device):
            raise ConfigError(f"{p}.device", f"must be auto, cpu, cuda or cuda:N, got {c.device!r}", src)

    @staticmethod
    def TokenizerConfig(c: TokenizerConfig, p: str, src: str) -> None:
        if c.kind == "gpt2" and c.vocab_size != 50257:
            raise ConfigError(f"{p}.vocab_size", "must be 50257 when kind is 'gpt2' (GPT-2 BPE is fixed)", src)

    @staticmethod
    def CorpusConfig(c: CorpusConfig, p: str, src: str) -> None:
        if c.source == "local":
            if not c.local_paths:
                raise ConfigError(f"{p}.local_paths", "must list at least one file or glob when source is 'local'", src)
            for i, pattern in enumerate(c.local_paths):
                if not _glob_any(pattern):
                    raise ConfigError(f"{p}.local_paths[{i}]", f"no file matches {pattern!r}", src)
        if c.max_docs and c.max_docs <= c.validation_docs:
            raise ConfigError(f"{p}.max_docs", f"must be 0 (all) or > validation_docs ({c.validation_docs}), got {c.max_docs}", src)

    @staticmethod
    def SftConfig(c: SftConfig, p: str, src: str) -> None:
        if c.source == "hub" and not c.hub_sources:
            raise ConfigError(f"{p}.hub_sources", "must list at least one source when source is 'hub'", src)
        if c.source == "offline" and not (c.humaneval or c.champ or c.arithmetic_examples):
            raise ConfigError(f"{p}.arithmetic_examples", "the offline mixture is empty: enable humaneval, champ or arithmetic", src)

    @staticmethod
    def ModelConfig(c: ModelConfig, p: str, src: str) -> None:
        if c.d_model % c.n_heads:
            raise ConfigError(f"{p}.d_model", f"must be a multiple of n_heads ({c.n_heads}), got {c.d_model}", src)
        if (c.d_model // c.n_heads) % 2:
            raise ConfigError(f"{p}.n_heads", "head dimension d_model/n_heads must be even (rotary embeddings)", src)

    @staticmethod
    def TrainConfig(c: TrainConfig, p: str, src: str) -> None:
        if c.global_batch % c.micro_batch:
            raise ConfigError(f"{p}.global_batch", f"must be a multiple of micro_batch ({c.micro_batch}), got {c.global_batch}", src)
        if c.residual == "bf16" and c.precision != "bf16":
            raise ConfigError(f"{p}.residual", f"bf16 needs train.precision bf16 (the stream is kept in autocast's dtype), got precision {c.precision}", src)
        _refuse_first([r for r in c.replicate_models if r not in c.models], f"{p}.replicate_models",
                      lambda r: f"{r!r} is not in train.models ({c.models})", src)

    @staticmethod
    def TrainedEvaluatorConfig(c: TrainedEvaluatorConfig, p: str, src: str) -> None:
        if c.d_model % c.n_heads:
            raise ConfigError(f"{p}.d_model", f"must be a multiple of n_heads ({c.n_heads}; GPT-2's heads split it), got {c.d_model}", src)

    @staticmethod
    def SampleConfig(c: SampleConfig, p: str, src: str) -> None:
        if c.canvas_length % c.block_size:
            raise ConfigError(f"{p}.canvas_length", f"must be a multiple of block_size ({c.block_size}), got {c.canvas_length}", src)
        if c.t_off >= c.t_on:
            raise ConfigError(f"{p}.t_off", f"must be < t_on ({c.t_on}), got {c.t_off}", src)
        for i, b in enumerate(c.budgets):
            if b.T in c.steps[:i]:
                raise ConfigError(f"{p}.budgets[{i}].T", f"budget T = {b.T} is listed twice", src)
            if b.K > b.T:
                raise ConfigError(f"{p}.budgets[{i}].K", f"must be <= its budget's T ({b.T}; a larger K refreshes "
                                  f"only at the start, as K = {b.T} does), got {b.K}", src)
        _refuse_first([K for K in c.sweep_refresh if K > max(c.steps)], f"{p}.sweep_refresh",
                      lambda K: f"must be <= the largest budget's T ({max(c.steps)}), got {K}", src)
        _refuse_first([T for T in c.replicate_steps if T not in c.steps], f"{p}.replicate_steps",
                      lambda T: f"{T} is not a sampling budget (the T of budgets: {c.steps})", src)

    @staticmethod
    def PosttrainConfig(c: PosttrainConfig, p: str, src: str) -> None:
        if c.base.top_k_experts > c.base.num_experts:
            raise ConfigError(f"{p}.base.top_k_experts", f"must be <= num_experts ({c.base.num_experts}), got {c.base.top_k_experts}", src)
        if c.base.num_attention_heads % c.base.num_key_value_heads:
            raise ConfigError(f"{p}.base.num_key_value_heads", f"must divide num_attention_heads ({c.base.num_attention_heads})", src)
        if abs(sum(c.cache_age_probs) - 1.0) > 1e-6:
            raise ConfigError(f"{p}.cache_age_probs", f"must sum to 1, got {sum(c.cache_age_probs):g}", src)
        _refuse_first([k for k in c.refresh_every if k > c.sample_steps], f"{p}.refresh_every",
                      lambda k: f"must be <= sample_steps ({c.sample_steps}, the denoising steps per canvas; a larger K "
                                f"refreshes once per canvas, as K = {c.sample_steps} does), got {k}", src)
        if c.feature_cache_share and math.floor(c.feature_cache_share * c.canvas_length + 1e-9) < 1:
            raise ConfigError(f"{p}.feature_cache_share", f"recomputes no row of the {c.canvas_length}-row canvas "
                              f"(floor(share x canvas_length) = 0): must be 0 (the matched share) or >= "
                              f"1/canvas_length ({1 / c.canvas_length:g}), got {c.feature_cache_share!r}", src)
        _refuse_first([s for s in c.seeds if c.cache_seeds and s not in c.cache_seeds], f"{p}.cache_seeds",
                      lambda s: f"must include every seed of posttrain.seeds ({c.seeds}; the cache rows are paired with "
                                f"TADM's at them), {s} is missing", src)
        _refuse_first([k for k in c.replicate_refresh_every if k not in c.refresh_every], f"{p}.replicate_refresh_every",
                      lambda k: f"{k} is not a K of refresh_every ({c.refresh_every})", src)

    @staticmethod
    def AsrdConfig(c: AsrdConfig, p: str, src: str) -> None:
        if c.response_tokens % c.block_size:
            raise ConfigError(f"{p}.response_tokens", f"must be a multiple of block_size ({c.block_size}), got {c.response_tokens}", src)
        if c.steps % (c.response_tokens // c.block_size):
            raise ConfigError(f"{p}.steps", f"must divide evenly over the {c.response_tokens // c.block_size} blocks, got {c.steps}", src)
        if c.spelling_eval >= c.spelling_max:
            raise ConfigError(f"{p}.spelling_eval", f"must be below spelling_max ({c.spelling_max}), got {c.spelling_eval}", src)
        if c.t_off >= c.t_on:
            raise ConfigError(f"{p}.t_off", f"must be < t_on ({c.t_on}), got {c.t_off}", src)
        if c.llada_gen_tokens % c.llada_block_size:
            raise ConfigError(f"{p}.llada_gen_tokens", f"must be a multiple of llada_block_size ({c.llada_block_size}), got {c.llada_gen_tokens}", src)
        if c.llada_steps % (c.llada_gen_tokens // c.llada_block_size):
            raise ConfigError(f"{p}.llada_steps", f"must divide evenly over the {c.llada_gen_tokens // c.llada_block_size} blocks, got {c.llada_steps}", src)
        _refuse_first([k for k in c.llada_cache_refresh if k > c.llada_steps], f"{p}.llada_cache_refresh",
                      lambda k: f"must be <= llada_steps ({c.llada_steps}; a larger K never refreshes after the first "
                                f"pass), got {k}", src)
        if c.refresh_every > max(c.steps, c.dg_steps):
            raise ConfigError(f"{p}.refresh_every", f"must be <= the decoding steps (steps {c.steps}, dg_steps {c.dg_steps}; "
                              f"a larger K never refreshes after the first pass), got {c.refresh_every}", src)
        tasks = typing.get_args(typing.get_args(typing.get_type_hints(AsrdConfig)["llada_tasks"])[0])
        for task in c.llada_dllm_cache:
            if task not in tasks:
                raise ConfigError(f"{p}.llada_dllm_cache.{task}", f"unknown task; LLaDA's tasks are {', '.join(tasks)}", src)
        for b in c.sweep_block_size:
            if c.response_tokens % b or c.steps % (c.response_tokens // b):
                raise ConfigError(f"{p}.sweep_block_size", f"each must tile response_tokens ({c.response_tokens}) into "
                                  f"blocks that steps ({c.steps}) divides evenly, got {b}", src)

    @staticmethod
    def Params(c: Params, p: str, src: str) -> None:
        missing = [m for m in c.claims.training_free_comparator if m not in c.posttrain.cache_methods]
        if c.posttrain.cache_methods and missing:
            raise ConfigError("claims.training_free_comparator", f"each must be one of posttrain.cache_methods "
                              f"({', '.join(c.posttrain.cache_methods)}: the caches Table 1 runs; with none the "
                              f"comparison is not run), got {', '.join(map(repr, missing))}", src)
        blocks = c.posttrain.canvas_length // c.asrd.block_size
        if c.posttrain.canvas_length % c.asrd.block_size or c.asrd.dg_steps % blocks:
            raise ConfigError("asrd.dg_steps", f"DiffusionGemma's canvas (posttrain.canvas_length {c.posttrain.canvas_length}) must split into "
                              f"blocks of asrd.block_size ({c.asrd.block_size}) that dg_steps ({c.asrd.dg_steps}) divides evenly", src)
        if c.sample.canvas_length > c.packing.seq_len:
            raise ConfigError("sample.canvas_length", f"must be <= packing.seq_len ({c.packing.seq_len}), got {c.sample.canvas_length}", src)


def _glob_any(pattern: str) -> bool:
    return bool(glob.glob(str(Path(pattern).expanduser()), recursive=True))


# --------------------------------------------------------------------------- loading


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def as_bool(value: Any, name: str) -> bool:
    """A notebook's boolean parameter as papermill hands it over: a bool, 0 / 1, or text
    (`-p flag false` arrives as the string "false", which ``bool`` would make True). Anything
    else is a one-line ConfigError naming the parameter."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, f"must be true or false, got {value!r}", source="notebook parameter")


# --------------------------------------------------------------------------- loading


def from_dict(raw: dict, source: str = "params.yaml") -> Params:
    """Validate a raw mapping that sets every key and return typed :class:`Params`."""
    if not isinstance(raw, dict):
        raise ConfigError("(top level)", "must be a mapping of sections", source)
    profile = raw.get("profile")
    return _build(Params, raw, "", source, profile if isinstance(profile, str) else None)


def load(path: str | Path = PARAMS_FILE) -> Params:
    """Load and validate ``params.yaml`` (or any params file): it must set every key."""
    path = Path(path)
    return from_dict(read_yaml(path, source=path.name), source=path.name)


def to_dict(params: Params) -> dict:
    return dataclasses.asdict(params)


def override(params: Params, changes: dict, source: str = "overrides") -> Params:
    """`params` with dotted keys replaced, e.g. {"seed": 3, "sample.batch_size": 8}; None
    values are skipped; the result is validated like a params file."""
    raw = to_dict(params)
    for key, value in changes.items():
        if value is None:
            continue
        *path, leaf = key.split(".")
        node = raw
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ConfigError(key, "no such section", source=source)
            node = node[part]
        if leaf not in node:
            raise ConfigError(key, "no such key", source=source)
        node[leaf] = value
    return from_dict(raw, source=source)


def deep_merge(base: dict, overlay: dict) -> dict:
    out = dict(base)
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def merged_profile(name: str) -> dict:
    """default.yaml with profiles/<name>.yaml overlaid key by key (not validated)."""
    raw = read_yaml(PROFILES_DIR / "default.yaml", source="profiles/default.yaml")
    if name != "default":
        raw = deep_merge(raw, read_yaml(PROFILES_DIR / f"{name}.yaml", source=f"profiles/{name}.yaml"))
    return raw


def render_profile(name: str) -> dict:
    """The full params mapping of a profile: default.yaml with the profile's overlay.

    This is the only inheritance: default.yaml must set every key (a key missing from it is
    an error, however the overlay looks), an overlay sets only what its profile changes."""
    if name not in available_profiles():
        raise ConfigError("profile", f"unknown profile {name!r}; available: {', '.join(available_profiles())}", source="profiles/")
    raw = merged_profile(name)
    from_dict(raw, source=f"profiles/{name}.yaml")  # validate before anyone writes it
    return raw


PARAMS_HEADER = (
    "# Active run parameters (DVC params). Rendered from profiles/{name}.yaml by\n"
    "#   python -m tadm profile {name}\n"
    "# Edit freely or override one key with `dvc exp run -S section.key=value`.\n"
)


def write_profile(name: str, path: str | Path = PARAMS_FILE) -> Path:
    """Render profile `name` into params.yaml (atomically)."""
    from tadm.io import atomic_write_text  # lazy: tadm.io (~13 ms) only to write a profile; every command's start-up loads this module

    raw = render_profile(name)
    text = PARAMS_HEADER.format(name=name) + yaml.safe_dump(raw, sort_keys=False, width=100)
    atomic_write_text(Path(path), text)
    return Path(path)
