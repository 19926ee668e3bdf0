"""Sampling for the TADM hub models (standalone: imports only torch and the standard library).

    tokens = model.generate(num_samples=4)                       # the checkpoint's own sampler
    tokens = model.generate(num_samples=4, steps=128, refresh_every=4, seed=1)

A port of the project's released samplers (``tadm.sampling``), written to draw exactly what
they draw from the same seed: the same random numbers in the same order, the same arithmetic.

Masked families (mdlm, sedd, adlm, tadm): the canvas starts all masks (a prompt, if given, fixed
at positions 0..P-1 and never remasked); blocks of `block_size` positions are generated left to
right, the `steps` reverse steps split evenly over them, on the grid t_i = i / T_b, s = t_i - 1 / T_b.
At each step every position of the current block draws one uniform u (from a generator of its
own, seeded by one ``randint(0, 2**62)`` of the run's generator, in `precision`):

    masked:   decodes if u < unmask          decoded:  is re-masked if u < remask

    mdlm, sedd-analytic   unmask = (alpha_s - alpha_t) / (1 - alpha_t), remask = 0
    remdm-cap / rescale   sigma = min(eta, sigma_max) / eta * sigma_max
    remdm-loop            alpha: alpha_on (1 - t) / (1 - t_on) for t > t_on, alpha_on on
                          (t_off, t_on] (sigma = eta there), 1 - (1 - alpha_on) t / t_off below
                          unmask = (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), remask = sigma

alpha_t = 1 - (1 - eps) t (log-linear, eps from config.json's noise_schedule). The decoding rows'
x_theta is SUBS (the mask logit -inf, softmax) in `precision`, nucleus (top-p) filtered and drawn
by the inverse CDF (one uniform per row, row-major order, from the run's generator). TADM runs its
anchor when step - last refresh >= refresh_every (Alg. 1, K), its denoiser at every step that
decodes. Autoregressive (ar): position 0 is BOS, then each position from a one-position forward
against a KV cache, top-p filtered, drawn by the exponential race.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

MASKED_SAMPLERS = ("mdlm", "sedd-analytic", "remdm-cap", "remdm-rescale", "remdm-loop")
PRECISIONS = {"float64": torch.float64, "float32": torch.float32}
RATE_TOLERANCE = 1e-12
# what generate reads from generation_config.json and accepts as a keyword, with its default
DEFAULTS: dict[str, Any] = {
    "sampler": None,  # None: the family's ("sedd-analytic" for SEDD, "ar" for AR, else "remdm-loop")
    "steps": None,  # None: seq_len
    "top_p": 1.0,
    "refresh_every": 1,  # TADM's K
    "block_size": None,  # None: the whole canvas is one block
    "eta": 0.02,
    "t_on": 0.55,
    "t_off": 0.05,
    "alpha_on": 0.9,
    "precision": "float64",
    "seed": 0,
    "batch_size": None,  # sequences per trajectory; None: all at once
    "max_length": None,  # the canvas length; None: seq_len
    "bos_token_id": None,  # AR: position 0 (None: config.json's)
}


# --------------------------------------------------------------------------- settings


def _family_sampler(family: str) -> str:
    return {"sedd": "sedd-analytic", "ar": "ar"}.get(family, "remdm-loop")


def resolve_settings(model, generation_config, seed: Optional[int], overrides: dict) -> dict:
    """The run's settings: DEFAULTS, then the generation config's values (its unknown keys are
    other transformers' settings and are ignored), then the keyword `overrides`, each checked.
    An unknown keyword, or a value the samplers cannot honour, is one line."""
    unknown = sorted(k for k in overrides if k not in DEFAULTS and k not in ("temperature", "do_sample"))
    if unknown:
        raise TypeError(f"generate: unknown argument(s) {', '.join(unknown)}; known: "
                        f"{', '.join(sorted(DEFAULTS))}, temperature (1 only), do_sample (True only)")
    s = dict(DEFAULTS)
    stored = generation_config.to_dict() if generation_config is not None else {}
    for key in DEFAULTS:
        if stored.get(key) is not None:
            s[key] = stored[key]
    for key in ("temperature", "do_sample"):
        value = overrides.get(key, stored.get(key))
        if key == "temperature" and value is not None and float(value) != 1.0:
            raise ValueError(f"generate: temperature must be 1 (the samplers draw from x_theta as trained), got {value!r}")
        if key == "do_sample" and key in overrides and value is not True:
            raise ValueError(f"generate: do_sample must be True (the samplers only sample), got {value!r}")
    s.update({k: v for k, v in overrides.items() if k in DEFAULTS})
    if seed is not None:
        s["seed"] = seed
    family = model.config.model_type
    s["sampler"] = s["sampler"] or _family_sampler(family)
    allowed = ("ar",) if family == "ar" else MASKED_SAMPLERS
    if s["sampler"] not in allowed:
        raise ValueError(f"generate: sampler {s['sampler']!r} does not sample a {family!r} model; "
                         f"known: {', '.join(allowed)}")
    s["max_length"] = model.config.seq_len if s["max_length"] is None else s["max_length"]
    s["steps"] = s["max_length"] if s["steps"] is None else s["steps"]
    for key in ("steps", "refresh_every", "max_length", "seed"):
        _integer(key, s[key], 0 if key == "seed" else 1)
    for key in ("block_size", "batch_size", "bos_token_id"):
        if s[key] is not None:
            _integer(key, s[key], 0 if key == "bos_token_id" else 1)
    if not 0.0 < float(s["top_p"]) <= 1.0:
        raise ValueError(f"generate: top_p must be in (0, 1], got {s['top_p']!r}")
    if not 0.0 <= float(s["eta"]) <= 1.0:
        raise ValueError(f"generate: eta must be in [0, 1], got {s['eta']!r}")
    if not 0.0 <= float(s["t_off"]) < float(s["t_on"]) <= 1.0:
        raise ValueError(f"generate: need 0 <= t_off < t_on <= 1, got t_off={s['t_off']!r}, t_on={s['t_on']!r}")
    if not 0.0 < float(s["alpha_on"]) < 1.0:
        raise ValueError(f"generate: alpha_on must be in (0, 1), got {s['alpha_on']!r}")
    precision = s["precision"]
    if isinstance(precision, str):
        if precision not in PRECISIONS:
            raise ValueError(f"generate: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        precision = PRECISIONS[precision]
    if precision not in PRECISIONS.values():
        raise ValueError(f"generate: precision must be torch.float64 or torch.float32, got {precision!r}")
    s["precision"] = precision
    schedule = getattr(model.config, "noise_schedule", None) or {"type": "loglinear", "eps": 1e-3}
    if schedule.get("type") != "loglinear":
        raise ValueError(f"config.json: noise_schedule type {schedule.get('type')!r} is not 'loglinear'")
    s["eps"] = float(schedule.get("eps", 1e-3))
    return s


def _integer(key: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"generate: {key} must be an integer >= {least}, got {value!r}")


# --------------------------------------------------------------------------- entry point


def generate_for(model, input_ids: Optional[Tensor], *, num_samples: Optional[int], generation_config,
                 generator: Optional[torch.Generator], seed: Optional[int], overrides: dict) -> Tensor:
    """The body of the models' ``generate`` (its docstring): (N, max_length) token ids on the
    model's device."""
    if generation_config is None:
        generation_config = getattr(model, "generation_config", None)
    s = resolve_settings(model, generation_config, seed, overrides)
    device = next(model.parameters()).device
    length = s["max_length"]
    prompt = None
    if input_ids is not None:
        if input_ids.dim() != 2 or input_ids.shape[1] >= length:
            raise ValueError(f"generate: input_ids must be a (batch, P) prompt with P < {length}, "
                             f"got shape {tuple(input_ids.shape)}")
        prompt = input_ids.to(device=device, dtype=torch.long)
        if num_samples is not None and num_samples != prompt.shape[0]:
            raise ValueError(f"generate: num_samples ({num_samples}) differs from the prompts' batch ({prompt.shape[0]})")
        num_samples = prompt.shape[0]
    num_samples = 1 if num_samples is None else num_samples
    _integer("num_samples", num_samples, 1)
    if generator is None:
        generator = torch.Generator(device).manual_seed(s["seed"])
    batch = s["batch_size"] or num_samples
    chunks = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for done in range(0, num_samples, batch):
                size = min(batch, num_samples - done)
                part = None if prompt is None else prompt[done:done + size]
                if model.config.model_type == "ar":
                    chunks.append(_ar_rollout(model, s, size, length, part, generator))
                else:
                    chunks.append(_masked_trajectory(model, s, size, length, part, generator))
    finally:
        model.train(was_training)
    return torch.cat(chunks)


# --------------------------------------------------------------------------- masked families


def _block_ranges(length: int, block_size: Optional[int]) -> list[tuple[int, int]]:
    size = length if block_size is None else block_size
    if length % size:
        raise ValueError(f"generate: max_length ({length}) must be a multiple of block_size ({size})")
    return [(lo, lo + size) for lo in range(0, length, size)]


def _loglinear_alphas(times: list[float], eps: float) -> dict[float, float]:
    """alpha_t = 1 - (1 - eps) t at each time, evaluated in float64 (as the reference does)."""
    values = 1.0 - (1.0 - eps) * torch.tensor(times, dtype=torch.float64)
    return dict(zip(times, values.tolist()))


def _loop_alpha(t: float, s: dict) -> float:
    """ReMDM-loop's three-phase alpha(t)."""
    t_on, t_off, alpha_on = s["t_on"], s["t_off"], s["alpha_on"]
    if t > t_on:
        return alpha_on * (1.0 - t) / (1.0 - t_on)
    if t > t_off:
        return alpha_on
    return 1.0 if t_off == 0.0 else 1.0 - (1.0 - alpha_on) * t / t_off


def step_rates(s: dict, t: float, t_next: float, alphas: dict[float, float]) -> tuple[float, float]:
    """(unmask, remask) of the step from t to s = t_next: host numbers, checked to lie in [0, 1]
    up to rounding and clamped to it."""
    sampler, eta = s["sampler"], s["eta"]
    if sampler == "remdm-loop":
        alpha_t, alpha_s = _loop_alpha(t, s), _loop_alpha(t_next, s)
    else:
        alpha_t, alpha_s = alphas[t], alphas[t_next]
    if not 0.0 <= alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0:
        raise ValueError(f"need 0 <= alpha_t <= alpha_s <= 1 and alpha_t < 1, got alpha_t={alpha_t}, alpha_s={alpha_s}")
    if sampler in ("mdlm", "sedd-analytic"):
        unmask, remask = (alpha_s - alpha_t) / (1.0 - alpha_t), 0.0
    else:
        smax = 1.0 if alpha_t <= 0.0 else min(1.0, (1.0 - alpha_s) / alpha_t)
        if sampler == "remdm-cap":
            sigma = min(eta, smax)
        elif sampler == "remdm-rescale":
            sigma = eta * smax
        else:  # loop: remask only inside the window (t_off, t_on]
            sigma = min(eta, smax) if s["t_off"] < t <= s["t_on"] else 0.0
        unmask, remask = (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t), sigma
    for rate in (unmask, remask):
        if rate < -RATE_TOLERANCE or rate > 1 + RATE_TOLERANCE:
            raise ValueError(f"transition rates must lie in [0, 1], got {rate}")
    return min(max(unmask, 0.0), 1.0), min(max(remask, 0.0), 1.0)


def x_theta_rows(logits: Tensor, mask_id: int, precision: torch.dtype) -> Tensor:
    """SUBS x_theta at masked rows (N, V+1) in `precision`: the mask logit -inf, softmax."""
    logits = logits.to(precision).clone()
    logits[..., mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1)


def _inverse_cdf(csum: Tensor, mass: Tensor, u: Tensor) -> Tensor:
    """(N, 1): the first j with csum_j > u * mass, the target kept strictly below mass."""
    x = torch.minimum(u * mass, torch.nextafter(mass, torch.zeros_like(mass)))
    return torch.searchsorted(csum, x.unsqueeze(-1), right=True)


def draw_top_p(probs: Tensor, p: float, generator: torch.Generator) -> Tensor:
    """One token per row of probs (N, C) from top-p(probs): one uniform per row, then the
    inverse CDF on the descending-sorted cumulative mass of the kept prefix (those with
    cumulative mass <= p, at least the most likely); p = 1: on the unsorted cumulative mass."""
    u = torch.rand(probs.shape[:-1], generator=generator, device=probs.device, dtype=probs.dtype)
    if p >= 1.0:
        csum = probs.cumsum(-1)
        return _inverse_cdf(csum, csum[:, -1], u).squeeze(-1)
    ranked, order = probs.sort(dim=-1, descending=True)
    csum = ranked.cumsum(-1)
    kept = (csum <= p).sum(-1).clamp_min(1)
    mass = csum.gather(-1, (kept - 1).unsqueeze(-1)).squeeze(-1)
    return order.gather(-1, _inverse_cdf(csum, mass, u)).squeeze(-1)


def mask_generator(generator: torch.Generator) -> torch.Generator:
    """The generator of the per-step uniforms, seeded by one draw of the run's generator."""
    seed = torch.randint(0, 2**62, (), generator=generator, device=generator.device)
    return torch.Generator(generator.device).manual_seed(int(seed))


def _masked_trajectory(model, s: dict, batch: int, length: int, prompt: Optional[Tensor],
                       generator: torch.Generator) -> Tensor:
    """One batched reverse process (module docstring) -> tokens (B, length)."""
    device, precision = next(model.parameters()).device, s["precision"]
    mask_id = model.config.vocab_size
    blocks = _block_ranges(length, s["block_size"])
    if s["steps"] % len(blocks):
        raise ValueError(f"generate: steps ({s['steps']}) must divide evenly over {len(blocks)} blocks")
    per_block = s["steps"] // len(blocks)
    grid = [(i / per_block, (i - 1) / per_block) for i in range(per_block, 0, -1)]
    alphas = _loglinear_alphas(sorted({t for pair in grid for t in pair}), s["eps"])
    rates = [step_rates(s, t, t_next, alphas) for t, t_next in grid]
    z = torch.full((batch, length), mask_id, dtype=torch.long, device=device)
    fixed = torch.zeros(length, dtype=torch.bool, device=device)
    if prompt is not None:
        z[:, :prompt.shape[1]] = prompt
        fixed[:prompt.shape[1]] = True
    masks = mask_generator(generator)
    positions = torch.arange(length, device=device)
    anchored = model.config.model_type == "tadm"
    K, anchor, refreshed = s["refresh_every"], None, None
    step = 0
    for lo, hi in blocks:
        active = (positions >= lo) & (positions < hi) & ~fixed  # (L,)
        for unmask, remask in rates:
            u = torch.rand(z.shape, generator=masks, device=device, dtype=precision)  # (B, L)
            masked = z == mask_id
            unmask_rate = torch.zeros(z.shape, dtype=precision, device=device).masked_fill_(masked & active, unmask)
            remask_rate = torch.zeros(z.shape, dtype=precision, device=device).masked_fill_(~masked & active, remask)
            decoded, remasked = masked & (u < unmask_rate), ~masked & (u < remask_rate)
            if anchored and (refreshed is None or step - refreshed >= K):  # Alg. 1: refresh the anchor
                anchor, refreshed = model.anchor(z), step
            z_next = z.masked_fill(remasked, mask_id)
            rows = decoded.reshape(-1).nonzero().squeeze(-1)  # (N,) row-major
            if len(rows):
                hidden = model.denoise_hidden(z, anchor) if anchored else model.hidden(z)  # (B, L, d)
                logits = model.head(hidden.flatten(0, 1).index_select(0, rows).unsqueeze(0)).squeeze(0)  # (N, V+1)
                tokens = draw_top_p(x_theta_rows(logits, mask_id, precision), float(s["top_p"]), generator)
                z_next.view(-1).scatter_(0, rows, tokens)
            z = z_next
            step += 1
        left = int(((z == mask_id) & active).sum())
        if left:
            raise RuntimeError(f"sampler {s['sampler']!r} left {left} masked positions in block [{lo}, {hi})")
    return z


# --------------------------------------------------------------------------- autoregressive


def nucleus_filter(probs: Tensor, p: float) -> Tensor:
    """Top-p: keep the descending prefix with cumulative mass <= p (at least one), renormalise."""
    if p >= 1.0:
        return probs
    ranked, order = probs.sort(dim=-1, descending=True)
    keep = ranked.cumsum(-1) <= p
    keep[..., 0] = True
    kept = ranked * keep
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, kept)


def sample_categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw per row by the exponential race: argmax_c p_c / E_c, E_c ~ Exp(1)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    e = (-torch.log1p(-u)).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / e).argmax(dim=-1)


def _ar_rollout(model, s: dict, batch: int, length: int, prompt: Optional[Tensor],
                generator: torch.Generator) -> Tensor:
    """Left to right from BOS (or the prompt): (B, length)."""
    device = next(model.parameters()).device
    bos = s["bos_token_id"] if s["bos_token_id"] is not None else getattr(model.config, "bos_token_id", None)
    if prompt is None and bos is None:
        raise ValueError("generate: config.json has no bos_token_id; pass a prompt as input_ids")
    x = torch.full((batch, length), 0 if bos is None else bos, dtype=torch.long, device=device)
    given = 1
    if prompt is not None:
        x[:, :prompt.shape[1]] = prompt
        given = prompt.shape[1]
    cache = model.new_cache(batch, length)
    for i in range(1, length):
        logits = model.forward_cached(x[:, i - 1:i], cache)[:, -1]  # (B, V): position i - 1 predicts i
        if i < given:
            continue
        probs = nucleus_filter(torch.softmax(logits.to(s["precision"]), dim=-1), float(s["top_p"]))
        x[:, i] = sample_categorical(probs, generator)
    return x


__all__ = ["generate_for", "resolve_settings", "step_rates", "draw_top_p", "x_theta_rows", "nucleus_filter",
           "sample_categorical", "mask_generator", "DEFAULTS", "MASKED_SAMPLERS"]
