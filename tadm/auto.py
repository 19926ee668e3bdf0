"""TADM:Pretraining and the Table 2 baselines through transformers' Auto classes.

    import tadm
    from transformers import AutoConfig, AutoModel

    model = AutoModel.from_pretrained("models/tadm")      # the pipeline's own directory
    logits = model(input_ids)                             # (B, L, V+1), z_t in 0..V (V = mask)
    model.save_pretrained("out/")                         # the same two files, bit for bit

Each model family (`mdlm`, `adlm`, `tadm`, `sedd`, `ar`: the model_type in a checkpoint's
config.json) has a `PretrainedConfig` subclass and a `PreTrainedModel` subclass registered with
`AutoConfig`, `AutoModel` and `AutoModelForMaskedLM` under that model_type, with no
`trust_remote_code`. The model wraps the project's network (``.net``, a `tadm.models.TadmModel`);
`from_pretrained` loads through `tadm.models.load_pretrained` (config.json bounded and checked
against the safetensors headers, every tensor strictly) and `save_pretrained` writes the
project's layout, so a checkpoint round-trips bit for bit and every checkpoint the pipeline ever
wrote loads.

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



def families() -> tuple[str, ...]:
    """The model_type of every method unit (`tadm.registry.METHODS`), in registration order."""
    from tadm.registry import METHODS

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
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

    from tadm import runtime
    from tadm.config import ModelConfig
    from tadm.models import build_model, load_pretrained
    from tadm.registry import method_for

    class TadmConfig(PretrainedConfig):
        """A TADM checkpoint's config.json: model_type, vocab_size (V, the mask id), seq_len,
        the ModelConfig fields under ``model``, format_version (read as attributes)."""

    class TadmPreTrainedModel(PreTrainedModel):
        """A `TadmModel` (``.net``) behind transformers' model interface."""

        base_model_prefix = "net"
        main_input_name = "input_ids"

        def __init__(self, config, net=None):
            super().__init__(config)
            self.post_init()  # before the network: post_init re-initialises what is attached
            if net is None:
                net = build_model(config.model_type, ModelConfig(**config.model), config.vocab_size, config.seq_len)
            self.net = net

        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, device_map=None, **kwargs):
            """Load a local checkpoint directory strictly (tadm.models.load_pretrained); `device_map`:
            a device for every weight (default: the CPU). Hub names: download the directory first
            (huggingface_hub.snapshot_download) and pass its path."""
            path = Path(pretrained_model_name_or_path)
            if not path.is_dir():
                raise ValueError(f"{str(path)!r} is not a local checkpoint directory (download a hub repository "
                                 "with huggingface_hub.snapshot_download and pass its path)")
            # strict, and refuses non-finite weights (tadm.models.io.check_finite)
            net = load_pretrained(path, map_location=torch.device(device_map) if device_map else runtime.CPU)
            if config is None:
                config = cls.config_class.from_pretrained(path)
            if config.model_type != net.model_type:
                raise ValueError(f"{path}: config model_type {config.model_type!r} but a {net.model_type!r} checkpoint")
            return cls(config, net).eval()

        def save_pretrained(self, save_directory, *args, **kwargs):
            """The project's layout (config.json + model.safetensors, atomic): what
            `from_pretrained` and `tadm.models.load_pretrained` read."""
            return self.net.save_pretrained(save_directory)

        def forward(self, input_ids, **kwargs):
            """input_ids (B, L) in 0..V (V: the mask token; AR: 0..V-1) -> logits (B, L, V+1)
            (AR: (B, L, V)) of the whole network: TADM with a fresh anchor on the same canvas,
            ADLM's denoiser (its anchor's logits are internal): `Method.canvas_logits`."""
            return method_for(self.net.model_type).canvas_logits(self.net, input_ids)

    for model_type in families():
        if model_type in _CLASSES:
            continue
        name = model_type.upper()
        config_cls = type(f"{name}Config", (TadmConfig,), {"model_type": model_type, "__module__": __name__})
        model_cls = type(f"{name}Model", (TadmPreTrainedModel,), {"config_class": config_cls, "__module__": __name__})
        _CLASSES[model_type] = config_cls, model_cls


def bound_config_reading() -> None:
    """transformers' config reader (``PretrainedConfig._dict_from_json_file``) through the
    project's bounded reader: a ValueError line, before the file is read, for a config.json over
    1 MiB or nested too deeply, and for a TADM checkpoint's config (it has ``format_version``)
    whose model_type is not one of `families()`. Idempotent."""
    from transformers.configuration_utils import PretrainedConfig

    if getattr(PretrainedConfig._dict_from_json_file, "_tadm_bounded", False):
        return
    from tadm import weights_header as wh

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
    """Register every family with AutoConfig, AutoModel and AutoModelForMaskedLM (idempotent),
    and bound transformers' config reading (`bound_config_reading`)."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    bound_config_reading()

    for model_type in families():
        config_cls, model_cls = classes(model_type)
        AutoConfig.register(model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        AutoModelForMaskedLM.register(config_cls, model_cls, exist_ok=True)


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
    from tadm.registry import METHODS

    if _on_method not in METHODS._listeners:
        METHODS.subscribe(_on_method)
    if AUTO_MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


__all__ = ["classes", "families", "register", "install"]
