"""The TADM project's networks for transformers' ``trust_remote_code`` (standalone: imports only
torch, transformers, the standard library and the two files beside it).

    from transformers import AutoModelForMaskedLM
    model = AutoModelForMaskedLM.from_pretrained("<hub dir>", trust_remote_code=True)
    out = model(input_ids)              # input_ids (B, L) in 0..V, V = the mask token
    out.logits                          # (B, L, V+1): raw logits, the mask column included

The inference network only, written to compute exactly what the project's ``tadm.models`` computes
(the same operations in the same order, so fp32 logits agree bit for bit; tested), with module
names equal to its state-dict keys at the model's top level, so one model.safetensors loads both
ways and loading is strict (a missing or unexpected tensor is an error, not a random init):

    MDLM / SEDD   z_t -> embedding (V+1, d) -> mdlm_layers DiT blocks -> final layer -> (B, L, V+1)
    ADLM          anchor DiT -> anchor logits (V+1) -> Linear(V+1, d) -> denoiser DiT -> (B, L, V+1)
    TADM          h = A(S(z_t'))  (the anchor, cacheable);  logits = D(Phi(S(z_t), h))
    AR            causal DiT over 0..V-1 -> next-token logits (B, L, V)

A DiT block is pre-LN attention + MLP with adaLN shift / scale / gate from a constant
conditioning vector c (the sigma = 0 embedding: none of the models is time-conditioned) and
rotary positions. SUBS (the mask logit -inf, decoded positions copied) is the caller's job, as in
MDLM's hub model; `x0_log_probs` applies it. SEDD's output is read as its log-score base.
`generate` samples with the released samplers (`generation_tadm`).

Why one module of ~540 lines: transformers' ``trust_remote_code`` copies the files an
``auto_map`` names into a model directory, so the networks of every family live in this one
standalone file rather than across the package's model modules.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput
from transformers.utils import ModelOutput

from .configuration_tadm import ADLMConfig, ARConfig, MDLMConfig, SEDDConfig, TADMConfig, TadmHubConfig
from .generation_tadm import generate_for

COND_DIM = 128  # the conditioning vector c
FREQ_DIM = 256  # sinusoidal features of sigma fed to the condition embedder
ROPE_BASE = 10_000.0
GELU_APPROXIMATE = {"tanh": "tanh", "exact": "none"}  # config.model.gelu -> nn.GELU(approximate=...)
CARRIED_FILES = ("README.md", "tokenizer.json", "tokenizer_config.json")  # kept by save_pretrained


# --------------------------------------------------------------------------- pieces


class LayerNorm(nn.Module):
    """LayerNorm with a learned scale and no bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x * (1 + scale) + shift."""
    return x * (1 + scale) + shift


def sigma_features(device: torch.device, dim: int = FREQ_DIM, max_period: float = 10_000.0) -> torch.Tensor:
    """The sinusoidal features of sigma = 0, (1, dim) = [cos(0 f); sin(0 f)], in float32."""
    t = torch.zeros(1, device=device)
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ConditionEmbedder(nn.Module):
    """c = SiLU(MLP(features(sigma = 0))): a learned constant, (1, COND_DIM)."""

    def __init__(self, cond_dim: int = COND_DIM, freq_dim: int = FREQ_DIM):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self) -> torch.Tensor:
        weight = self.mlp[0].weight
        features = sigma_features(weight.device, self.freq_dim).to(weight.dtype)  # cast to the parameters' dtype
        return F.silu(self.mlp(features))


def rotary_cos_sin(seq_len: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables (seq_len, head_dim) in float32; channels i and i + head_dim/2 rotate
    together by pos * base^(-2i/head_dim) (the rotate-half layout)."""
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., L, head_dim) rotated by position; the tables are cast to x's dtype."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


class SelfAttention(nn.Module):
    """Multi-head attention with rotary positions; bidirectional unless `causal`."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, d) -> q, k (rotated), v, each (B, H, L, head_dim)."""
        B, L, d = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        cos, sin = rope
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        B, L, d = x.shape
        q, k, v = self.project(x, rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(B, L, d))


class DiTBlock(nn.Module):
    """x += gate_a Attn(modulate(LN(x))); x += gate_m MLP(modulate(LN(x))), (shift, scale, gate) x 2 = adaLN(c)."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, gelu: str, causal: bool = False):
        super().__init__()
        self.norm1 = LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, causal)
        self.norm2 = LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(approximate=GELU_APPROXIMATE[gelu]),
                                 nn.Linear(mlp_ratio * d_model, d_model))
        self.adaLN_modulation = nn.Linear(COND_DIM, 6 * d_model)

    def modulation(self, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """c (1, COND_DIM) -> shift_a, scale_a, gate_a, shift_m, scale_m, gate_m, each (1, 1, d)."""
        return self.adaLN_modulation(c)[:, None].chunk(6, dim=-1)

    def forward(self, x: torch.Tensor, c: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.modulation(c)
        x = x + gate_a * self.attn(modulate(self.norm1(x), shift_a, scale_a), rope)
        x = x + gate_m * self.mlp(modulate(self.norm2(x), shift_m, scale_m))
        return x


class DiTStack(nn.ModuleList):
    """Blocks applied in order with one rotary table per call (keys ``<stack>.<i>.<...>``)."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, mlp_ratio: int, gelu: str, causal: bool = False):
        super().__init__(DiTBlock(d_model, n_heads, mlp_ratio, gelu, causal) for _ in range(n_layers))
        self.head_dim = d_model // n_heads

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (B, L, d), c (1, COND_DIM) -> (B, L, d)."""
        rope = rotary_cos_sin(x.shape[1], self.head_dim, x.device)
        for block in self:
            x = block(x, c, rope)
        return x


class DiTFinalLayer(nn.Module):
    """LN + adaLN (shift, scale) + Linear(d, n_out)."""

    def __init__(self, d_model: int, n_out: int):
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.linear = nn.Linear(d_model, n_out)
        self.adaLN_modulation = nn.Linear(COND_DIM, 2 * d_model)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (B, L, d) or (N, d), c (1, COND_DIM) -> (B, L, n_out) or (N, n_out)."""
        mods = self.adaLN_modulation(c)
        shift, scale = mods.view(mods.shape[0], *([1] * (x.dim() - 2)), -1).chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x), shift, scale))


class Fusion(nn.Module):
    """TADM's Phi: h~ = h + sigmoid(W_g u + b_g) * Delta(u), u = [LN(S(z_t)); LN(h)] (2d)."""

    def __init__(self, d_model: int, hidden_ratio: int = 4):
        super().__init__()
        self.norm_c = nn.LayerNorm(d_model)
        self.norm_h = nn.LayerNorm(d_model)
        self.gate = nn.Linear(2 * d_model, d_model)
        self.delta = nn.Sequential(nn.Linear(2 * d_model, hidden_ratio * d_model), nn.GELU(),
                                   nn.Linear(hidden_ratio * d_model, d_model))

    def forward(self, c_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """c_t, h (B, L, d) -> h~ (B, L, d)."""
        u = torch.cat([self.norm_c(c_t), self.norm_h(h)], dim=-1)
        return h + torch.sigmoid(self.gate(u)) * self.delta(u)


def x0_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, mask_token_id: int,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MDLM's SUBS parameterisation of x_theta (B, L, V+1) as log-probabilities in `dtype`: the
    mask column -inf and a softmax over the vocabulary at masked positions; a point mass on the
    token (log-prob 0, -inf elsewhere) at the others."""
    logits = logits.to(dtype).clone()
    logits[..., mask_token_id] = float("-inf")
    log_probs = torch.log_softmax(logits, dim=-1)
    carry = F.one_hot(input_ids, logits.shape[-1]).bool()
    point_mass = torch.where(carry, torch.zeros((), dtype=dtype, device=logits.device), float("-inf"))
    return torch.where((input_ids == mask_token_id).unsqueeze(-1), log_probs, point_mass)


def _source_file(source: str, name: str) -> Optional[str]:
    """`name` of the local directory or (cached) hub repository `source`, or None."""
    if os.path.isdir(source):
        path = os.path.join(source, name)
        return path if os.path.isfile(path) else None
    try:
        # lazy: inside the try: a transformers without cached_file gives None, not an ImportError
        from transformers.utils import cached_file

        return cached_file(source, name, _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False)
    except Exception:  # not a repository id, offline without a cached copy, ...
        return None


@dataclass
class TADMOutput(ModelOutput):
    """logits (B, L, V+1) and the anchor h = A(S(z_t')) (B, L, d) they were computed with (pass
    it back as ``anchor_hidden_states`` to reuse it: TADM's anchor cache)."""

    logits: Optional[torch.FloatTensor] = None
    anchor_hidden_states: Optional[torch.FloatTensor] = None


# --------------------------------------------------------------------------- models


class TadmHubModel(PreTrainedModel, GenerationMixin):
    """Shared behaviour: strict loading (every tensor of the file, nothing else), eval mode, and
    `generate` (this class's own: the project's samplers; GenerationMixin is a base only so that
    transformers loads and saves generation_config.json with the model. The class name must
    not contain "PreTrainedModel": transformers' `can_generate` skips such bases)."""

    config_class = TadmHubConfig
    base_model_prefix = "tadm"
    main_input_name = "input_ids"
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        sizes = config.sizes()
        self.d_model, self.n_heads = sizes["d_model"], sizes["n_heads"]
        self.vocab_size, self.seq_len = config.vocab_size, config.seq_len
        self._sizes = sizes

    def _stack(self, n_layers: int, causal: bool = False) -> DiTStack:
        s = self._sizes
        return DiTStack(n_layers, s["d_model"], s["n_heads"], s["mlp_ratio"], s["gelu"], causal)

    def _init_weights(self, module):
        """Nothing: every weight comes from the checkpoint (loading is strict), and a model built
        from its config keeps torch's default initialisation."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' loading, then strict: a ValueError (one line) naming the tensors the
        file lacks, has in excess or holds in another shape; every tensor then copied into storage
        of its own, so the logits equal the project's bit for bit on every CPU."""
        wanted = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        problems = [f"missing {k}" for k in sorted(info.get("missing_keys") or ())]
        problems += [f"unexpected {k}" for k in sorted(info.get("unexpected_keys") or ())]
        problems += [f"shape of {m[0] if isinstance(m, (tuple, list)) else m}" for m in info.get("mismatched_keys") or ()]
        if problems:
            more = f"; +{len(problems) - 5} more" if len(problems) > 5 else ""
            raise ValueError(f"{pretrained_model_name_or_path}: model.safetensors does not fit {cls.__name__} "
                             f"({len(problems)} tensor(s)): {'; '.join(problems[:5])}{more}")
        with torch.no_grad():  # each tensor in storage of its own (aligned as torch allocates): loading can leave
            for t in [*model.parameters(), *model.buffers()]:  # them at any offset of one file's buffer, where
                t.data = t.data.clone()  # some CPUs' kernels (AVX2 GEMV) round otherwise than on the project's tensors
        model.eval()
        return (model, info) if wanted else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save (config.json with auto_map, the weights, generation_config.json and
        the three code files), plus the card and the tokenizer of the directory or hub repository
        the model was loaded from (`CARRIED_FILES`, where it has them), so the saved directory
        is a complete hub directory again."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        source = str(getattr(self.config, "_name_or_path", "") or "")
        for name in CARRIED_FILES:
            target = os.path.join(save_directory, name)
            found = _source_file(source, name) if source else None
            if found and not os.path.exists(target) and os.path.abspath(found) != os.path.abspath(target):
                shutil.copyfile(found, target)
        return result

    @staticmethod
    def _check_inputs(input_ids: torch.Tensor, attention_mask, kwargs: dict) -> None:
        """Refuse what the network cannot honour, in one line: padding, and unknown arguments."""
        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in ("output_attentions",
                                                                                    "output_hidden_states"))
        if extra:
            raise TypeError(f"unexpected argument(s) {', '.join(extra)}; the forward takes input_ids"
                            " (and attention_mask of ones)")
        if input_ids is None or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a (batch, length) tensor, got "
                             f"{None if input_ids is None else tuple(input_ids.shape)}")
        if attention_mask is not None and not bool((attention_mask != 0).all()):
            raise ValueError("attention_mask has zeros: the network attends to every position (no padding); "
                             "pass full-length canvases")

    def generate(self, input_ids: Optional[torch.Tensor] = None, *, num_samples: Optional[int] = None,
                 generation_config=None, generator: Optional[torch.Generator] = None, seed: Optional[int] = None,
                 **overrides) -> torch.Tensor:
        """Sample (num_samples or B, seq_len) token ids with the checkpoint's sampler
        (generation_config.json: sampler, steps, top_p, refresh_every, ...; keyword overrides
        win). `input_ids` (B, P): a prompt kept at positions 0..P-1. Randomness from `generator`,
        else one seeded with `seed` (default: generation_config's seed, 0). Equal, token for
        token, to the project's ``tadm.sampling`` with the same settings and seed
        (`generation_tadm`)."""
        return generate_for(self, input_ids, num_samples=num_samples, generation_config=generation_config,
                            generator=generator, seed=seed, overrides=overrides)


class MDLMForMaskedLM(TadmHubModel):
    """MDLM: one DiT over the canvas; forward -> MaskedLMOutput(logits (B, L, V+1))."""

    config_class = MDLMConfig

    def __init__(self, config):
        super().__init__(config)
        n_out = config.vocab_size + 1
        self.embed = nn.Embedding(n_out, self.d_model)
        self.cond = ConditionEmbedder()
        self.blocks = self._stack(self._sizes["mdlm_layers"])
        self.final = DiTFinalLayer(self.d_model, n_out)
        self.post_init()

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) -> the last block's output (B, L, d)."""
        return self.blocks(self.embed(input_ids), self.cond())

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> logits (..., V+1)."""
        return self.final(hidden, self.cond())

    def forward(self, input_ids: torch.Tensor = None, attention_mask=None, return_dict: Optional[bool] = None,
                **kwargs):
        self._check_inputs(input_ids, attention_mask, kwargs)
        logits = self.head(self.hidden(input_ids))
        return MaskedLMOutput(logits=logits) if return_dict is not False else (logits,)


class SEDDForMaskedLM(MDLMForMaskedLM):
    """SEDD (absorbing): MDLM's network; its logits are the log-score base."""

    config_class = SEDDConfig


class ADLMForMaskedLM(TadmHubModel):
    """ADLM: anchor DiT -> anchor logits -> Linear(V+1, d) -> denoiser DiT -> logits (B, L, V+1)."""

    config_class = ADLMConfig

    def __init__(self, config):
        super().__init__(config)
        d, n_out, s = self.d_model, config.vocab_size + 1, self._sizes
        self.embed = nn.Embedding(n_out, d)
        self.anchor_cond = ConditionEmbedder()
        self.anchor_blocks = self._stack(s["anchor_layers"])
        self.anchor_final = DiTFinalLayer(d, n_out)
        self.denoiser_in = nn.Linear(n_out, d)
        self.denoiser_cond = ConditionEmbedder()
        self.denoiser_blocks = self._stack(s["denoiser_layers"])
        self.final = DiTFinalLayer(d, n_out)
        self.post_init()

    def anchor(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) -> anchor logits (B, L, V+1)."""
        c = self.anchor_cond()
        return self.anchor_final(self.anchor_blocks(self.embed(input_ids), c), c)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) -> the denoiser's last hidden states (B, L, d)."""
        return self.denoiser_blocks(self.denoiser_in(self.anchor(input_ids)), self.denoiser_cond())

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.final(hidden, self.denoiser_cond())

    def forward(self, input_ids: torch.Tensor = None, attention_mask=None, return_dict: Optional[bool] = None,
                **kwargs):
        self._check_inputs(input_ids, attention_mask, kwargs)
        logits = self.head(self.hidden(input_ids))
        return MaskedLMOutput(logits=logits) if return_dict is not False else (logits,)


class TADMForMaskedLM(TadmHubModel):
    """TADM:Pretraining: S (the embedding), the anchor A, the fusion Phi, the denoiser D.
    ``anchor_head`` is training-only (kept so that loading stays strict; never run)."""

    config_class = TADMConfig

    def __init__(self, config):
        super().__init__(config)
        d, n_out, s = self.d_model, config.vocab_size + 1, self._sizes
        self.embed = nn.Embedding(n_out, d)  # S
        self.anchor_cond = ConditionEmbedder()
        self.anchor_blocks = self._stack(s["anchor_layers"])  # A
        self.fusion = Fusion(d)  # Phi
        self.denoiser_cond = ConditionEmbedder()
        self.denoiser_blocks = self._stack(s["denoiser_layers"])  # D
        self.final = DiTFinalLayer(d, n_out)  # D's head
        self.anchor_head = DiTFinalLayer(d, n_out)  # training only
        self.post_init()

    def anchor(self, input_ids: torch.Tensor) -> torch.Tensor:
        """S + A on the (stale) canvas z_t' (B, L) -> h (B, L, d): the state TADM caches."""
        return self.anchor_blocks(self.embed(input_ids), self.anchor_cond())

    def denoise_hidden(self, input_ids: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """S, Phi and D's blocks: z_t (B, L) and a cached h (B, L, d) -> (B, L, d)."""
        if anchor.shape[:2] != input_ids.shape:
            raise ValueError(f"anchor_hidden_states has shape {tuple(anchor.shape)}, expected "
                             f"{tuple(input_ids.shape)} + (d,) for input_ids")
        return self.denoiser_blocks(self.fusion(self.embed(input_ids), anchor), self.denoiser_cond())

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A fresh anchor on the same canvas: denoise_hidden(z, anchor(z))."""
        return self.denoise_hidden(input_ids, self.anchor(input_ids))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.final(hidden, self.denoiser_cond())

    def forward(self, input_ids: torch.Tensor = None, attention_mask=None, anchor_input_ids: torch.Tensor = None,
                anchor_hidden_states: torch.Tensor = None, return_dict: Optional[bool] = None, **kwargs):
        """input_ids z_t (B, L); the anchor from `anchor_hidden_states` (a cached h), else from
        `anchor_input_ids` (the stale z_t'), else from z_t itself -> TADMOutput(logits, h)."""
        self._check_inputs(input_ids, attention_mask, kwargs)
        if anchor_hidden_states is not None and anchor_input_ids is not None:
            raise ValueError("pass anchor_input_ids or anchor_hidden_states, not both")
        h = anchor_hidden_states
        if h is None:
            h = self.anchor(input_ids if anchor_input_ids is None else anchor_input_ids)
        logits = self.head(self.denoise_hidden(input_ids, h))
        return TADMOutput(logits=logits, anchor_hidden_states=h) if return_dict is not False else (logits, h)


class ARForCausalLM(TadmHubModel):
    """The autoregressive baseline: causal DiT, (B, L) in 0..V-1 -> next-token logits (B, L, V)
    (position i predicts token i+1)."""

    config_class = ARConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, self.d_model)
        self.cond = ConditionEmbedder()
        self.blocks = self._stack(self._sizes["mdlm_layers"], causal=True)
        self.final = DiTFinalLayer(self.d_model, config.vocab_size)
        self.post_init()

    def forward(self, input_ids: torch.Tensor = None, attention_mask=None, labels: torch.Tensor = None,
                return_dict: Optional[bool] = None, **kwargs):
        """-> CausalLMOutput(loss, logits): loss the mean next-token cross-entropy of `labels`
        (B, L) shifted by one (-100 ignored), when given."""
        self._check_inputs(input_ids, attention_mask, kwargs)
        c = self.cond()
        logits = self.final(self.blocks(self.embed(input_ids), c), c)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return CausalLMOutput(loss=loss, logits=logits)

    # one position at a time against cached keys / values (the sampler's KV cache)

    def new_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `batch` sequences of up to `max_len` positions, with the
        conditioning, each block's adaLN parameters and the rotary table computed once."""
        cond = self.cond()
        return {"length": 0, "max_len": max_len, "keys": [], "values": [], "cond": cond,
                "mods": [block.modulation(cond) for block in self.blocks],
                "rope": rotary_cos_sin(max_len, self.blocks.head_dim, cond.device)}

    def forward_cached(self, x_new: torch.Tensor, cache: dict) -> torch.Tensor:
        """Next-token logits (B, n, V) of the n positions x_new (B, n) after the cache's
        `length` ones; their keys and values are appended (the tables written in place)."""
        start, n = cache["length"], x_new.shape[1]
        if start + n > cache["max_len"]:
            raise ValueError(f"KV cache holds {cache['max_len']} positions, asked for {start + n}")
        cos, sin = cache["rope"]
        rope = (cos[start:start + n], sin[start:start + n])
        h = self.embed(x_new)
        for layer, block in enumerate(self.blocks):
            h = self._block_cached(block, layer, h, cache, rope, start)
        cache["length"] = start + n
        return self.final(h, cache["cond"])

    @staticmethod
    def _block_cached(block: DiTBlock, layer: int, x: torch.Tensor, cache: dict,
                      rope: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        """DiTBlock.forward for positions start..start+n-1 (B, n, d), attending to the cached ones."""
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = cache["mods"][layer]
        a_in = modulate(block.norm1(x), shift_a, scale_a)
        B, n, d = a_in.shape
        q, k, v = block.attn.project(a_in, rope)
        if layer == len(cache["keys"]):
            cache["keys"].append(k.new_empty(B, k.shape[1], cache["max_len"], k.shape[-1]))
            cache["values"].append(v.new_empty(B, v.shape[1], cache["max_len"], v.shape[-1]))
        end = start + n
        cache["keys"][layer][:, :, start:end] = k
        cache["values"][layer][:, :, start:end] = v
        keys, values = cache["keys"][layer][:, :, :end], cache["values"][layer][:, :, :end]
        if n == 1:  # one query: every cached key is at or before it
            y = F.scaled_dot_product_attention(q, keys, values)
        elif start == 0:
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        else:  # query i (at start + i) sees keys 0..start + i
            qpos = torch.arange(start, end, device=x.device)
            mask = torch.arange(end, device=x.device)[None, :] <= qpos[:, None]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        y = block.attn.out(y.transpose(1, 2).reshape(B, n, d))
        x = x + gate_a * y
        x = x + gate_m * block.mlp(modulate(block.norm2(x), shift_m, scale_m))
        return x


MODEL_CLASSES = {"mdlm": MDLMForMaskedLM, "sedd": SEDDForMaskedLM, "adlm": ADLMForMaskedLM,
                 "tadm": TADMForMaskedLM, "ar": ARForCausalLM}

__all__ = ["MDLMForMaskedLM", "SEDDForMaskedLM", "ADLMForMaskedLM", "TADMForMaskedLM", "ARForCausalLM",
           "TADMOutput", "x0_log_probs", "MODEL_CLASSES"]
