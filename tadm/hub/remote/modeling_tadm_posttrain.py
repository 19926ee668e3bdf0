"""TADM:Post-train for transformers' ``trust_remote_code``: a frozen DiffusionGemma base, the trained
fusion, and generation with the anchor refreshed every K denoising steps (standalone: imports only
torch, transformers, the standard library and ``configuration_tadm_posttrain`` beside it).

    from transformers import AutoModel
    model = AutoModel.from_pretrained("<hub dir>", trust_remote_code=True)  # loads the base it names
    out = model.generate(input_ids, attention_mask=mask, refresh_every=2)   # out.sequences (B, P + N)

The base is ``DiffusionGemmaForBlockDiffusion.from_pretrained(base_model_name_or_path)``, unchanged.
Its canvas decoder of N layers is cut, without touching a weight, into

    S  shared:   token embedding + self-conditioning + decoder layers [0, s)
    A  anchor:   decoder layers [s, s + a)                 (cached, recomputed every K steps)
    D  denoiser: decoder layers [s + a, N) + final norm + LM head + logit soft-capping

and one denoising step (one decoder call of transformers' DiffusionGemma ``generate``) is

    refresh step:  C0 = S(z), H0 = A(C0), logits = D(H0)     (control, values "state": D(Phi(C0; C0, H0)))
    reuse step:    c  = S(z),             logits = D(Phi(c; C0, H0))

with Phi the paired-attention fusion of fusion.safetensors. A new canvas (no self-conditioning
logits yet, or a longer prompt cache) always starts with a refresh. Written from the project's
``tadm.posttrain`` (backbone, fusion, anchored) to compute the same operations in the same order,
so fp32 logits and sampled tokens agree with it (tested).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import DiffusionGemmaForBlockDiffusion, GenerationMixin, PreTrainedModel
from transformers.modeling_utils import load_state_dict
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationMixin,
    EntropyBoundSamplerConfig,
)
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaBlockDiffusionOutputWithPast
from transformers.utils import cached_file

from .configuration_tadm_posttrain import TADMPostTrainConfig

HUB_KEYS = ("cache_dir", "force_download", "local_files_only", "proxies", "token", "revision", "subfolder")
BASE_KEYS = ("dtype", "torch_dtype", "device_map", "attn_implementation", "low_cpu_mem_usage", "max_memory",
             "offload_folder")
IGNORED_KEYS = ("trust_remote_code", "adapter_kwargs", "_from_auto", "_from_pipeline", "code_revision")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


class PairedAttentionFusion(nn.Module):
    """h~ = Phi(c; C0, H0) = H0 + sigmoid(w_g . q + b_g) * W_up MHA(q, k, v), in the rank-r space:
    q = W_q RMSNorm(c), k = W_k [RMSNorm(C0); RMSNorm(H0)], v = W_v (c - C0) ("change") or W_v c
    ("state"). Module names equal fusion.safetensors' keys."""

    def __init__(self, hidden_size: int, rank: int, heads: int, values: str = "change", eps: float = 1e-6):
        super().__init__()
        self.rank, self.heads, self.values = rank, heads, values
        self.norm_c, self.norm_c0, self.norm_h0 = (RMSNorm(hidden_size, eps) for _ in range(3))
        self.q = nn.Linear(hidden_size, rank, bias=False)
        self.k = nn.Linear(2 * hidden_size, rank, bias=False)
        self.v = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        self.gate = nn.Linear(rank, 1)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, r) -> (B, heads, n, r / heads)
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.rank // self.heads).transpose(1, 2)

    def forward(self, c: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:  # each (B, n, d)
        dtype = self.q.weight.dtype  # float32: inputs are cast to the fusion's dtype, the result back to H0's
        cf, c0f, h0f = c.to(dtype), c0.to(dtype), h0.to(dtype)
        q = self.q(self.norm_c(cf))  # (B, n, r)
        k = self.k(torch.cat([self.norm_c0(c0f), self.norm_h0(h0f)], dim=-1))  # (B, n, r)
        v = self.v(cf - c0f if self.values == "change" else cf)  # (B, n, r); zero when c == C0 ("change")
        o = F.scaled_dot_product_attention(self._split(q), self._split(k), self._split(v))  # (B, heads, n, r/heads)
        o = o.transpose(1, 2).reshape(q.shape)  # (B, n, r)
        return h0 + (torch.sigmoid(self.gate(q)) * self.up(o)).to(h0.dtype)  # (B, n, d)


@dataclass
class _Anchor:
    c0: torch.Tensor  # (B, n, d) S(z) at the refresh
    h0: torch.Tensor  # (B, n, d) A(C0)
    age: int  # steps since the refresh
    prefix: int  # the prompt cache's length for the canvas it belongs to


class _Generate(DiffusionGemmaGenerationMixin):
    """What transformers' DiffusionGemma ``generate`` reads from a DiffusionGemmaForBlockDiffusion
    (the base's config, encoder and generation config), its decoder call replaced by the
    time-anchored step of `owner`."""

    def __init__(self, owner: "TADMPostTrainForBlockDiffusion"):
        self.owner = owner

    config = property(lambda self: self.owner.base.config)
    model = property(lambda self: self.owner.base.model)
    generation_config = property(lambda self: self.owner.base.generation_config)
    dtype = property(lambda self: self.owner.base.dtype)
    device = property(lambda self: self.owner.base.device)

    def forward(self, decoder_input_ids: torch.Tensor, **kwargs) -> DiffusionGemmaBlockDiffusionOutputWithPast:
        return self.owner.decoder_step(decoder_input_ids, **kwargs)


class TADMPostTrainForBlockDiffusion(PreTrainedModel, GenerationMixin):
    """The frozen base (``.base``), the fusion (``.fusion``) and the anchor cache. ``forward`` is
    one denoising step (encoding ``input_ids`` first when given); ``generate`` is transformers'
    DiffusionGemma ``generate`` with the anchor refreshed every ``refresh_every`` steps."""

    config_class = TADMPostTrainConfig
    base_model_prefix = "tadm_posttrain"
    main_input_name = "input_ids"

    def __init__(self, config: TADMPostTrainConfig, base: nn.Module | None = None):
        super().__init__(config)
        if base is None:
            raise ValueError("TADMPostTrainForBlockDiffusion needs its base: load it with from_pretrained, which "
                             "reads base_model_name_or_path")
        text = base.config.text_config
        s, a, d = config.check().split
        if s + a + d != text.num_hidden_layers or config.hidden_size != text.hidden_size:
            raise ValueError(f"base {config.base_model_name_or_path!r}: {text.num_hidden_layers} decoder layers of "
                             f"width {text.hidden_size}, the fusion was trained on {s}+{a}+{d} of width "
                             f"{config.hidden_size}: not its base")
        self.base = base.eval().requires_grad_(False)
        self.bounds = {"shared": (0, s), "anchor": (s, s + a), "denoiser": (s + a, s + a + d)}
        self.fusion = PairedAttentionFusion(config.hidden_size, config.fusion_rank, config.fusion_heads,
                                            config.fusion_values, config.rms_norm_eps).to(base.device)
        self.refresh_every = config.refresh_every  # K: the default of generate and of forward's steps
        self.sampling = {}  # generation_config.json: the sampler's settings, generate's defaults
        self.base_model_path = config.base_model_name_or_path  # where the base was loaded from
        self._anchor: _Anchor | None = None
        self._generate = _Generate(self)
        self.post_init()

    def _init_weights(self, module):
        """Nothing: the base comes from its checkpoint, the fusion from fusion.safetensors (strict)."""

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        """Load the base named by config.json's ``base_model_name_or_path`` (or the keyword of that
        name), build the split and the fusion, and load fusion.safetensors strictly. Keywords:
        transformers' hub ones (for this directory; cache_dir, token, local_files_only and proxies
        also for a hub base), and ``dtype``, ``device_map``, ``attn_implementation``, ... for the
        base (default dtype: config.json's base_dtype). Anything else is a TypeError."""
        if args:
            raise TypeError(f"{cls.__name__}.from_pretrained takes no positional arguments after the path")
        path = str(pretrained_model_name_or_path)
        hub = {k: kwargs.pop(k) for k in HUB_KEYS if k in kwargs}
        base_kw = {k: kwargs.pop(k) for k in BASE_KEYS if k in kwargs}
        base_name = kwargs.pop("base_model_name_or_path", None)
        for key in IGNORED_KEYS:
            kwargs.pop(key, None)
        if kwargs:
            raise TypeError(f"{cls.__name__}.from_pretrained: unexpected keyword(s) {', '.join(sorted(kwargs))}")
        if config is None:
            config = cls.config_class.from_pretrained(path, **hub)
        config.check()
        fusion_file = cached_file(path, "fusion.safetensors", **hub)
        where = os.path.dirname(fusion_file)  # this directory (a hub snapshot's folder for a hub id)
        base_path = _resolve_base(base_name or config.base_model_name_or_path, where)
        if "dtype" not in base_kw and "torch_dtype" not in base_kw:
            base_kw["dtype"] = getattr(torch, getattr(config, "base_dtype", None) or "float32")
        base_hub = {k: v for k, v in hub.items() if k in ("cache_dir", "local_files_only", "proxies", "token")}
        base = DiffusionGemmaForBlockDiffusion.from_pretrained(base_path, **base_hub, **base_kw)
        model = cls(config, base)
        model.base_model_path = base_path
        weights = load_state_dict(fusion_file)
        problems = model.fusion.load_state_dict({k: v.to(model.fusion.q.weight.dtype) for k, v in weights.items()},
                                                strict=False)
        if problems.missing_keys or problems.unexpected_keys:
            raise ValueError(f"{fusion_file}: does not fit the fusion of config.json (missing "
                             f"{problems.missing_keys}, unexpected {problems.unexpected_keys})")
        sampling = cached_file(path, "generation_config.json", _raise_exceptions_for_missing_entries=False, **hub)
        if sampling:
            with open(sampling, encoding="utf-8") as f:
                model.sampling = {k: v for k, v in json.load(f).items() if k != "transformers_version"}
        return model.eval()

    def save_pretrained(self, *args, **kwargs):
        raise NotImplementedError("a TADM:Post-train directory holds the fusion only and names its base: copy the "
                                  "directory, or export it again with python -m tadm.hub export-fusion")

    # ------------------------------------------------------------------ the split decoder

    def _decoder_inputs(self, ids: torch.Tensor, cache, decoder_attention_mask, decoder_position_ids):
        """Rotary embeddings, masks and positions of one decoder call, as the base computes them."""
        dec, text = self.base.model.decoder, self.base.config.text_config
        if cache is None:
            raise ValueError("cache: the decoder reads the prompt from the KV cache; pass input_ids or cache")
        if decoder_position_ids is None:
            start = cache.get_seq_length(layer_idx=0)
            decoder_position_ids = torch.arange(start, start + ids.shape[1], device=ids.device)[None]  # (1, n)
        masks = decoder_attention_mask
        if not isinstance(masks, dict):
            dummy = dec.embed_tokens.weight.new_empty(*ids.shape, 0)
            masks = dec.create_diffusion_decoder_attention_mask(config=text, inputs_embeds=dummy, cache=cache,
                                                                decoder_attention_mask=decoder_attention_mask)
        probe = dec.embed_tokens.weight.new_empty(1, 1, text.hidden_size)
        rope = {kind: dec.rotary_emb(probe, decoder_position_ids, kind) for kind in dec.unique_layer_types}
        return rope, masks, decoder_position_ids, cache

    def _layers(self, hidden: torch.Tensor, inputs, part: str) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        rope, masks, positions, cache = inputs
        kinds = self.base.config.text_config.layer_types
        for i in range(*self.bounds[part]):
            hidden = self.base.model.decoder.layers[i](hidden, position_embeddings=rope[kinds[i]],
                                                       attention_mask=masks[kinds[i]], position_ids=positions,
                                                       cache=cache)
        return hidden

    def _shared(self, ids, inputs, sc_logits=None, sc_mask=None) -> torch.Tensor:
        """c = S(z): embedding + self-conditioning signal + the shared layers; (B, n) -> (B, n, d)."""
        dec = self.base.model.decoder
        embeds = dec.embed_tokens(ids)  # (B, n, d), scaled
        if sc_logits is not None:  # (B, n, V): the previous step's logits, as a soft embedding
            weight = dec.embed_tokens.weight
            soft = sc_logits.softmax(dim=-1, dtype=torch.float32).to(weight.dtype) @ weight
            soft = soft * dec.embed_tokens.embed_scale.to(embeds.dtype)
            if sc_mask is not None:  # (B,) False: no self-conditioning for that row
                soft = soft * sc_mask.to(soft.dtype)[:, None, None]
        else:
            soft = torch.zeros_like(embeds)
        return self._layers(dec.self_conditioning(embeds, soft), inputs, "shared")

    def _denoise(self, h: torch.Tensor, inputs) -> torch.Tensor:
        """logits = D(h): the denoiser layers, norm, LM head, soft-capping; (B, n, d) -> (B, n, V) float32."""
        logits = self.base.lm_head(self.base.model.decoder.norm(self._layers(h, inputs, "denoiser"))).to(torch.float32)
        cap = self.base.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def decoder_step(self, decoder_input_ids, cache=None, self_conditioning_logits=None, self_conditioning_mask=None,
                     decoder_attention_mask=None, decoder_position_ids=None, **unused):
        """One denoising step's decoder call, the anchor refreshed or reused (the module docstring)."""
        if unused.get("input_ids") is not None:
            raise ValueError("input_ids: the decoder step runs the decoder only; encode the prompt first")
        inputs = self._decoder_inputs(decoder_input_ids, cache, decoder_attention_mask, decoder_position_ids)
        c = self._shared(decoder_input_ids, inputs, self_conditioning_logits, self_conditioning_mask)  # (B, n, d)
        prefix = cache.get_seq_length(layer_idx=0)
        stale = self._anchor
        refresh = (stale is None or self_conditioning_logits is None or stale.prefix != prefix
                   or stale.age + 1 >= self.refresh_every or stale.c0.shape != c.shape)
        if refresh:
            h = self._layers(c, inputs, "anchor")  # H0 = A(C0)
            self._anchor = _Anchor(c, h, 0, prefix)
            if self.fusion.values == "state":  # the fresh-anchor control: its fusion corrects the fresh anchor
                h = self.fusion(c, c, h)
        else:
            stale.age += 1
            h = self.fusion(c, stale.c0, stale.h0)
        return DiffusionGemmaBlockDiffusionOutputWithPast(logits=self._denoise(h, inputs), cache=cache)

    # ------------------------------------------------------------------ the public API

    def reset(self) -> None:
        """Forget the cached anchor (the next step refreshes)."""
        self._anchor = None

    def forward(self, input_ids=None, attention_mask=None, cache=None, position_ids=None, decoder_input_ids=None,
                self_conditioning_logits=None, self_conditioning_mask=None, decoder_attention_mask=None,
                decoder_position_ids=None) -> DiffusionGemmaBlockDiffusionOutputWithPast:
        """One denoising step on the canvas `decoder_input_ids` (B, n): the prompt `input_ids` (B, P)
        is encoded into `cache` first when given (as the base's forward does); the anchor of the last
        refresh is reused while it is younger than ``refresh_every`` steps and self-conditioning
        logits (B, n, V) are passed. Returns ``.logits`` (B, n, V) float32 and ``.cache``."""
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids: the canvas (B, n) to denoise is required")
        if input_ids is not None:
            cache = self.base.model.encoder(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                                            position_ids=position_ids).cache
        return self.decoder_step(decoder_input_ids, cache, self_conditioning_logits, self_conditioning_mask,
                                 decoder_attention_mask, decoder_position_ids)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 refresh_every: int | None = None, **kwargs):
        """transformers' DiffusionGemma ``generate`` (entropy-bound sampler, linear temperature
        schedule) with the anchor recomputed every `refresh_every` steps (default: config's K).
        generation_config.json's settings are the defaults of `kwargs` (steps, entropy bound,
        temperatures, adaptive stopping off); keywords win. Returns what the base's returns
        (``.sequences`` (B, P + N))."""
        k = self.refresh_every if refresh_every is None else refresh_every
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"refresh_every must be an integer >= 1, got {k!r}")
        settings = dict(self.sampling)
        if isinstance(settings.get("sampler_config"), dict):
            bound = {key: v for key, v in settings["sampler_config"].items() if key != "_cls_name"}
            settings["sampler_config"] = EntropyBoundSamplerConfig(**bound)
        settings.update(kwargs)
        if attention_mask is not None:
            settings["attention_mask"] = attention_mask
        default, self.refresh_every, self._anchor = self.refresh_every, k, None
        try:
            return self._generate.generate(input_ids, **settings)
        finally:
            self.refresh_every, self._anchor = default, None


def _resolve_base(name: str, where: str) -> str:
    """The base's hub id or directory: a name starting with ./ or ../ is looked up beside this
    directory (`where`), then from the working directory; ~ is expanded; anything else is a hub id."""
    name = os.path.expanduser(str(name))
    if name.startswith(("./", "../")) or name in (".", ".."):
        for candidate in (os.path.normpath(os.path.join(where, name)), os.path.abspath(name)):
            if os.path.isfile(os.path.join(candidate, "config.json")):
                return candidate
        raise ValueError(f"base_model_name_or_path {name!r}: no DiffusionGemma checkpoint beside {where} or in the "
                         "working directory; pass base_model_name_or_path= (a hub id or a directory)")
    return name


__all__ = ["TADMPostTrainForBlockDiffusion", "PairedAttentionFusion"]
