"""The transformers classes behind `tadm.auto`: one `PretrainedConfig` and one
`PreTrainedModel` subclass per model family (`family_classes`), over the shared `TadmConfig`
and `TadmPreTrainedModel`. Importing this module imports transformers (seconds): `tadm.auto`
imports it on first use only."""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput
from transformers.utils import ModelOutput

from tadm import runtime
from tadm import weights_header as wh
from tadm.config import ModelConfig
from tadm.errors import DataError
from tadm.hub.export import weights_bytes
from tadm.hub.remote.generation_tadm import resolve_settings
from tadm.io import atomic_path
from tadm.methods.base import EPS
from tadm.models import build_model, load_pretrained
from tadm.registry import method_for
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tadm.sampling.ar import sample_ar

# from_pretrained keywords transformers' Auto classes pass on (or a caller may), harmless for a
# local directory; any other keyword but dtype / torch_dtype / device_map / config is refused
PASSED_ON = ("_from_auto", "trust_remote_code", "adapter_kwargs", "revision", "code_revision", "cache_dir",
             "force_download", "local_files_only", "proxies", "token", "subfolder")
# what save_pretrained copies from the directory a model was loaded from (a hub directory's extras)
CARRIED = ("README.md", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
           "configuration_tadm.py", "modeling_tadm.py", "generation_tadm.py")


class TadmConfig(PretrainedConfig):
    """A TADM checkpoint's config.json: model_type, vocab_size (V, the mask id), seq_len,
    the ModelConfig fields under ``model``, format_version (read as attributes)."""

@dataclass
class TADMOutput(ModelOutput):
    """logits (B, L, V+1) and the anchor h = A(S(z_t')) (B, L, d) they used."""

    logits: Optional[torch.FloatTensor] = None
    anchor_hidden_states: Optional[torch.FloatTensor] = None

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
        self.source: Path | None = None  # the directory it was loaded from (save_pretrained's extras)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, device_map=None, dtype=None,
                        torch_dtype=None, **kwargs):
        """Load a local checkpoint directory strictly (tadm.models.load_pretrained); `device_map`:
        a device for every weight (default: the CPU); `dtype` (or `torch_dtype`): the weights'
        dtype (a torch.dtype or its name; "auto" or None: as saved). Any other keyword but the
        hub ones transformers passes on (`PASSED_ON`) is refused in one line. Hub names:
        download the directory first (huggingface_hub.snapshot_download) and pass its path."""
        unknown = sorted(k for k in kwargs if k not in PASSED_ON)
        if args or unknown:
            raise TypeError(f"{cls.__name__}.from_pretrained: unsupported argument(s) "
                            f"{', '.join(unknown) or f'{len(args)} positional'}; it takes config, dtype "
                            "(torch_dtype), device_map and transformers' hub keywords")
        if kwargs.get("adapter_kwargs"):
            raise TypeError(f"{cls.__name__}.from_pretrained: adapters are not supported")
        cast = _dtype(dtype, torch_dtype)
        path = Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or "")
        if not path.is_dir():
            raise ValueError(f"{str(path)!r} is not a local checkpoint directory (download a hub repository "
                             "with huggingface_hub.snapshot_download and pass its path)")
        # strict, and refuses non-finite weights (tadm.models.io.check_finite)
        net = load_pretrained(path, map_location=torch.device(device_map) if device_map else runtime.CPU)
        if cast is not None:
            net = net.to(cast)
        if config is None:
            config = cls.config_class.from_pretrained(path)
        if config.model_type != net.model_type:
            raise ValueError(f"{path}: config model_type {config.model_type!r} but a {net.model_type!r} checkpoint")
        model = cls(config, net).eval()
        model.source = path
        return model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """The project's layout (config.json + model.safetensors, atomic): what
        `from_pretrained` and `tadm.models.load_pretrained` read; the directory it was loaded
        from keeps its card (README.md) and whatever else of `CARRIED` it has. Loaded from a hub directory
        (its config.json has an ``auto_map``), it writes the hub directory again: the weights
        as `tadm.hub.export` writes them, the source's config.json, and its card, tokenizer,
        generation config and code files (`CARRIED`)."""
        source, target = self.source, Path(save_directory)
        extras: dict[str, bytes] = {}  # read first: the source may be the target itself
        if source is not None:
            config_path = source / "config.json"
            hub = config_path.is_file() and "auto_map" in wh.read_json(config_path, error=DataError)
            names = CARRIED + (("config.json",) if hub else ())
            extras = {name: (source / name).read_bytes() for name in names if (source / name).is_file()}
            if hub:
                extras["model.safetensors"] = weights_bytes(self.net)
        out = self.net.save_pretrained(target)
        for name, data in extras.items():
            with atomic_path(target / name) as tmp:
                tmp.write_bytes(data)
        return out

    def forward(self, input_ids, attention_mask=None, anchor_input_ids=None, anchor_hidden_states=None,
                labels=None, return_dict=None, **kwargs):
        """input_ids (B, L) in 0..V (V: the mask token; AR: 0..V-1) -> a ModelOutput whose
        ``.logits`` are (B, L, V+1) (AR: (B, L, V)) of the whole network, `Method.canvas_logits`:
        TADM with a fresh anchor on the same canvas (or on `anchor_input_ids`, or the cached
        `anchor_hidden_states`: `TADMOutput`), ADLM's denoiser (its anchor's logits are
        internal). AR: `CausalLMOutput`, with the shifted cross-entropy of `labels` as
        ``.loss``; the others: `MaskedLMOutput`. Padding (an attention_mask with zeros) and
        unknown arguments are refused in one line."""
        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in ("output_attentions",
                                                                                    "output_hidden_states"))
        if extra:
            raise TypeError(f"unexpected argument(s) {', '.join(extra)}; the forward takes input_ids"
                            " (and attention_mask of ones)")
        if attention_mask is not None and not bool((attention_mask != 0).all()):
            raise ValueError("attention_mask has zeros: the network attends to every position (no padding)")
        family = self.net.model_type
        if family != "tadm" and (anchor_input_ids is not None or anchor_hidden_states is not None):
            raise TypeError(f"anchor_input_ids / anchor_hidden_states apply to TADM, not {family!r}")
        if family == "tadm":
            if anchor_input_ids is not None and anchor_hidden_states is not None:
                raise ValueError("pass anchor_input_ids or anchor_hidden_states, not both")
            h = anchor_hidden_states
            if h is None:
                h = self.net.anchor(input_ids if anchor_input_ids is None else anchor_input_ids)
            logits = self.net.head(self.net.denoise_hidden(input_ids, h))
            return TADMOutput(logits=logits, anchor_hidden_states=h) if return_dict is not False else (logits, h)
        logits = method_for(family).canvas_logits(self.net, input_ids)
        if not method_for(family).masked:
            loss = None
            if labels is not None:
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                         labels[:, 1:].flatten(), ignore_index=-100)
            if return_dict is False:
                return (logits,) if loss is None else (loss, logits)
            return CausalLMOutput(loss=loss, logits=logits)
        if labels is not None:
            raise TypeError("labels: a masked diffusion model has no single-canvas loss here")
        return MaskedLMOutput(logits=logits) if return_dict is not False else (logits,)

    def generate(self, input_ids=None, *, num_samples=None, generation_config=None, generator=None,
                 seed=None, **overrides):
        """`num_samples` (default 1) sequences (N, max_length) with the reference samplers
        (`tadm.sampling.sample`; AR: `tadm.sampling.ar.sample_ar`), the settings of
        generation_config.json in the directory it was loaded from (or `generation_config`),
        then the keyword overrides: the keywords and defaults of a hub directory's
        ``generate`` (`tadm.hub.remote.generation_tadm`), which draws the same tokens.
        Prompts (`input_ids`) are the hub code's; an unknown keyword is one line."""
        return _reference_generate(self, input_ids, num_samples, generation_config, generator, seed, overrides)

def family_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of the family `model_type`: subclasses of `TadmConfig` and
    `TadmPreTrainedModel` named after it (e.g. TADMConfig, TADMModel)."""
    name = model_type.upper()
    home = "tadm.auto"  # the module users meet them through (tadm.auto.classes)
    config_cls = type(f"{name}Config", (TadmConfig,), {"model_type": model_type, "__module__": home})
    model_cls = type(f"{name}Model", (TadmPreTrainedModel,), {"config_class": config_cls, "__module__": home})
    return config_cls, model_cls


def _dtype(dtype, torch_dtype):
    """The dtype `from_pretrained` casts to (None: as saved) from `dtype` / `torch_dtype`."""
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise TypeError(f"from_pretrained: dtype={dtype!r} and torch_dtype={torch_dtype!r} differ; pass one")
    value = dtype if dtype is not None else torch_dtype
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        value = getattr(torch, value, None) if not value.startswith("torch.") else getattr(torch, value[6:], None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"from_pretrained: dtype must be a floating torch dtype or its name, got {dtype or torch_dtype!r}")
    return value


def _reference_generate(model, input_ids, num_samples, generation_config, generator, seed, overrides):
    """The body of `generate` (its docstring)."""
    if input_ids is not None:
        raise TypeError("generate: prompts (input_ids) are sampled by a hub directory's own code "
                        "(python -m tadm.hub export); the reference samples unconditionally")
    if generation_config is None and model.source is not None and (model.source / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(model.source)
    net = model.net
    view = types.SimpleNamespace(config=types.SimpleNamespace(
        model_type=net.model_type, seq_len=net.seq_len, bos_token_id=getattr(model.config, "bos_token_id", None),
        noise_schedule=getattr(model.config, "noise_schedule", None) or {"type": "loglinear", "eps": EPS}))
    s = resolve_settings(view, generation_config, seed, overrides)
    num_samples = 1 if num_samples is None else num_samples
    device = next(net.parameters()).device
    if generator is None:
        generator = torch.Generator(device).manual_seed(s["seed"])
    if not method_for(net.model_type).masked:
        bos = s["bos_token_id"] if s["bos_token_id"] is not None else view.config.bos_token_id
        if bos is None:
            raise ValueError("generate: the checkpoint has no bos_token_id; pass bos_token_id=")
        return sample_ar(net, num_samples, s["max_length"], bos_id=bos, generator=generator,
                         nucleus_p=float(s["top_p"]), precision=s["precision"], batch_size=s["batch_size"]).tokens
    settings = SamplerSettings(sampler=s["sampler"], steps=s["steps"], nucleus_p=float(s["top_p"]), seed=s["seed"],
                               precision=s["precision"], block_size=s["block_size"], eta=float(s["eta"]),
                               t_on=float(s["t_on"]), t_off=float(s["t_off"]), alpha_on=float(s["alpha_on"]),
                               eps=s["eps"], batch_size=s["batch_size"])
    refresh = FixedInterval(s["refresh_every"]) if method_for(net.model_type).refreshes else None
    with make_adapter(net, refresh) as adapter:
        return sample(adapter, settings, num_samples=num_samples, seq_len=s["max_length"], generator=generator).tokens
