"""TADM:Pretraining and the Table 2 baselines through transformers' Auto classes.

    import tadm
    from transformers import AutoConfig, AutoModel

    model = AutoModel.from_pretrained("models/tadm")      # the pipeline's own directory
    logits = model(input_ids).logits                      # (B, L, V+1), z_t in 0..V (V = mask)
    tokens = model.generate(num_samples=4, steps=64)      # tadm.sampling, the reference sampler
    model.save_pretrained("out/")                         # the same files, bit for bit

Each model family (`mdlm`, `adlm`, `tadm`, `sedd`, `ar`: the model_type in a checkpoint's
config.json) has a `PretrainedConfig` subclass and a `PreTrainedModel` subclass registered with
`AutoConfig`, `AutoModel` and, for a masked family, `AutoModelForMaskedLM` (the autoregressive
one: `AutoModelForCausalLM`) under that model_type, with no `trust_remote_code`. The model wraps
the project's network (``.net``, a `tadm.models.TadmModel`); `from_pretrained` loads through
`tadm.models.load_pretrained` (config.json bounded and checked against the safetensors headers,
every tensor strictly) and `save_pretrained` writes the project's layout, so a checkpoint
round-trips bit for bit and every checkpoint the pipeline ever wrote loads.

The same classes serve a hub directory (`tadm.hub.export`) once ``import tadm`` has run:
transformers prefers a registered model_type to the directory's own code even with
``trust_remote_code=True``, so these classes keep the hub models' contract -- `forward` returns a
`ModelOutput` with ``.logits`` (`MaskedLMOutput`; AR: `CausalLMOutput`; TADM: `TADMOutput`, which
also carries the anchor), ``dtype`` is honoured, any other unknown `from_pretrained` keyword is
refused in one line, `generate` samples (here with the reference, `tadm.sampling`) reading the
directory's generation_config.json, and `save_pretrained` of a hub directory writes the hub
directory again (its card, tokenizer, generation config, code files and config.json kept).

Registration also bounds how transformers reads a ``config.json`` from then on (`bound_config_reading`):
at most ``tadm.weights_header.MAX_CONFIG_BYTES`` (1 MiB) and nested no deeper than the
interpreter allows, checked before the file is read, for any model of the process; a config that
carries the project's ``format_version`` but a ``model_type`` that is not one of `families()` (every method unit's) is
refused in one line instead of loading another architecture with random weights.

Registration is lazy: importing transformers' Auto classes costs seconds and `import tadm` a
millisecond, so `import tadm` installs a hook (`install`) that registers the classes right
after ``transformers.models.auto`` is imported (or at once, when it already is).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

from tadm.errors import DataError
from tadm.registry import METHODS, method_for


def families() -> tuple[str, ...]:
    """The model_type of every method unit (`tadm.registry.METHODS`), in registration order."""
    return tuple(dict.fromkeys(unit.model.model_type for unit in METHODS.values()))


AUTO_MODULE = "transformers.models.auto.modeling_auto"  # AutoModel's module: imported by any Auto use
_CLASSES: dict[str, tuple[type, type]] = {}


def classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of `model_type`, built once (this imports transformers)."""
    if model_type not in families():
        raise ValueError(f"no transformers class for model_type {model_type!r}; known: {', '.join(families())}")
    if model_type not in _CLASSES:
        _build()
    return _CLASSES[model_type]


def _build() -> None:
    from tadm.auto_classes import family_classes  # lazy: tadm.auto_classes imports transformers (~2 s); `import tadm` stays ~15 ms

    for model_type in families():
        if model_type not in _CLASSES:
            _CLASSES[model_type] = family_classes(model_type)


def bound_config_reading() -> None:
    """transformers' config reader (``PretrainedConfig._dict_from_json_file``) through the
    project's bounded reader: a ValueError line, before the file is read, for a config.json over
    1 MiB or nested too deeply, and for a TADM checkpoint's config (it has ``format_version``)
    whose model_type is not one of `families()`. Idempotent."""
    # lazy: transformers takes ~2 s to import; `import tadm` only installs the hook
    from transformers.configuration_utils import PretrainedConfig

    if getattr(PretrainedConfig._dict_from_json_file, "_tadm_bounded", False):
        return
    from tadm import weights_header as wh  # lazy: tadm.weights_header (+ tadm.io, ~25 ms) would more than double `import tadm`

    decode = PretrainedConfig._decode_special_floats

    def _dict_from_json_file(cls, json_file):
        raw = wh.read_json(Path(json_file), error=_ConfigRefused)
        if "format_version" in raw and "model_type" in raw and raw["model_type"] not in families():
            raise _ConfigRefused(f"{str(json_file)!r}: a TADM checkpoint's config (format_version "
                                 f"{raw['format_version']!r}) with model_type {raw['model_type']!r}, not one of "
                                 f"{', '.join(families())}: refused rather than loading another architecture")
        return decode(raw)

    _dict_from_json_file._tadm_bounded = True
    PretrainedConfig._dict_from_json_file = classmethod(_dict_from_json_file)


class _ConfigRefused(DataError, ValueError):
    """A config.json transformers was about to read, refused (one line)."""


def register() -> None:
    """Register every family with AutoConfig, AutoModel and AutoModelForMaskedLM -- a family
    without a mask token (its method's ``masked`` False: AR) with AutoModelForCausalLM instead --
    (idempotent), and bound transformers' config reading (`bound_config_reading`)."""
    # lazy: transformers takes ~2 s to import; this runs once its Auto module has loaded
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    bound_config_reading()

    for model_type in families():
        config_cls, model_cls = classes(model_type)
        AutoConfig.register(model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        task = AutoModelForMaskedLM if method_for(model_type).masked else AutoModelForCausalLM
        task.register(config_cls, model_cls, exist_ok=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `register` once `AUTO_MODULE` has been executed (a post-import hook)."""

    def find_spec(self, name, path=None, target=None):
        if name != AUTO_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def _on_method(name: str, unit) -> None:
    """A method unit registered after the Auto classes were: register its family too."""
    if _CLASSES and AUTO_MODULE in sys.modules:
        register()


def install() -> None:
    """Have the Auto classes know TADM's families -- every method unit's, also one defined later
    (a `tadm.registry.METHODS` listener) --: at once when transformers' Auto module is loaded,
    else right after it is (`import tadm` calls this)."""
    if _on_method not in METHODS._listeners:
        METHODS.subscribe(_on_method)
    if AUTO_MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


__all__ = ["classes", "families", "register", "install"]
