"""Training objectives: the base's uniform-state block diffusion, and TADM:Post-train's fusion loss.

Base (default profile only; the paper starts from the released DiffusionGemma):
  z_t replaces each canvas token by a uniformly random token with probability t (the noise
  DiffusionGemma's sampler starts from and re-noises with); the loss is the cross-entropy of
  the clean canvas at every position. Self-conditioning as in training DiffusionGemma: with
  probability p a first, gradient-free pass supplies the self-conditioning logits.

Post-train (App. C.1): states are reached on-policy. From z_t the frozen model refreshes the
anchor (C0, H0); then k ~ cache_age_probs steps of DiffusionGemma's entropy-bound sampler run
under the cache policy (anchor reused, current fusion, no gradient), feeding each step's
tempered logits back as self-conditioning. At the resulting state z the fusion's prediction
D(Phi(S(z); C0, H0)) is trained with

    CE(clean canvas) + lambda * tau^2 * KL(teacher_tau || student_tau),

the teacher being the frozen model with a fresh anchor, D(A(S(z))). At k = 0 the fusion
returns H0 exactly (c = C0), so that part of the batch only anchors the loss value.

Table 1's fresh-anchor control (``fresh=True``, a fusion with ``values="state"``) takes the same
draws (times, noise, self-conditioning coin, cache age k, rollout draws) and the same loss, but
its policy never reuses an anchor: every rollout step and the trained state use
D(Phi(c; c, A(c))), the anchor recomputed on the current canvas. Only the anchor's age differs
from TADM's training, so Delta(TADM - control) in Table 1 isolates anchor reuse.

Every random draw comes from the generator it is given, on that generator's device (a CUDA
generator draws CUDA tensors), so a training step is reproducible on any device.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from tadm.compat import require_transformers

require_transformers(what="DiffusionGemma paths (tadm.posttrain.objective)")  # before transformers' DiffusionGemma

from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
)

from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.posttrain.data import CanvasBatch


def antithetic_times(n: int, gen: torch.Generator, device=None, eps: float = 1e-3) -> torch.Tensor:
    """n times in (eps, 1): one uniform offset, evenly spread (low-variance, MDLM-style); drawn
    on the generator's device, returned on `device` (default: the generator's).

    The offset is shared by the n strata, as in `tadm.forward_process.sample_times`; MDLM's
    release (``diffusion.py: _sample_t``) jitters each stratum independently. The variance
    difference is measured on the MDLM pretraining loss (`benchmarks/antithetic_variance.py`:
    0.96 +- 0.03 times the release's), not on this objective; kept so that the post-trained
    fusion is unchanged (docs/deviations.md)."""
    u = torch.rand((), generator=gen, device=gen.device)
    device = gen.device if device is None else device
    t = (torch.arange(n, device=device) + u.to(device)) / n
    return eps + (1 - eps) * t


def uniform_noise(x: torch.Tensor, t: torch.Tensor, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    """Replace each token by a uniform random one with probability t (per row)."""
    replace = torch.rand(x.shape, generator=gen, device=gen.device).to(x.device) < t[:, None]
    noise = torch.randint(0, vocab_size, x.shape, generator=gen, device=gen.device).to(x.device)
    return torch.where(replace, noise, x)


def _config(model):
    """The transformers config of a model that may be wrapped in DDP (``.module``) or
    torch.compile (which forwards attribute reads)."""
    return getattr(model, "module", model).config


def encoder_cache(model, batch: CanvasBatch):
    """The context's encoder KV cache, which the decoder reads and never writes: computed once
    per batch, it serves every decoder pass over that batch. `model` may be wrapped (DDP /
    torch.compile); the encoder is called on the wrapped module, and its parameters still get
    their gradients through the decoder passes that read the cache."""
    return getattr(model, "module", model).model.encoder(input_ids=batch.context,
                                                         attention_mask=batch.context_mask).cache


def decoder_logits(model, batch: CanvasBatch, z: torch.Tensor, sc_logits=None, sc_mask=None,
                   cache=None) -> torch.Tensor:
    """Logits of ``DiffusionGemmaForBlockDiffusion`` on canvas z given the batch's contexts
    (encoded here, or read from `cache`, :func:`encoder_cache` of the same batch)."""
    context = dict(cache=cache) if cache is not None else dict(input_ids=batch.context, attention_mask=batch.context_mask)
    return model(**context, decoder_input_ids=z, decoder_attention_mask=batch.decoder_mask,
                 self_conditioning_logits=sc_logits, self_conditioning_mask=sc_mask).logits


def base_loss(model, batch: CanvasBatch, gen: torch.Generator, self_cond_p: float) -> torch.Tensor:
    """Mean cross-entropy of the clean canvas from its uniform-noised version. The context is
    encoded once (with gradient) and read by both decoder passes: the gradient-free
    self-conditioning pass and the trained one (the same values and gradients as encoding it
    for each pass, at 0.86x the step time on the default profile's CPU)."""
    vocab = _config(model).text_config.vocab_size
    t = antithetic_times(len(batch.target), gen, batch.target.device)
    z = uniform_noise(batch.target, t, vocab, gen)
    use_sc = torch.rand(len(z), generator=gen, device=gen.device).to(z.device) < self_cond_p
    cache = encoder_cache(model, batch)
    sc = None
    if use_sc.any():
        with torch.no_grad():
            sc = decoder_logits(model, batch, z, cache=cache).detach()
    logits = decoder_logits(model, batch, z, sc, use_sc if sc is not None else None, cache=cache)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.target.flatten())


# ----------------------------------------------------------------------------- post-train


class Rollout:
    """DiffusionGemma's sampler step (the library's acceptance rule and temperature schedule),
    with its random draws from a generator so that training is reproducible."""

    def __init__(self, steps: int, entropy_bound: float, temperature: tuple[float, float], canvas: int, vocab: int):
        self.steps, self.vocab = steps, vocab
        self.sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(float(entropy_bound)), canvas, vocab, steps)
        t_max, t_min = temperature
        self.temperature = LinearTemperatureScheduleLogitsProcessor(t_min, t_max, steps)

    def cur_step(self, t: float) -> int:
        """The sampler's step (N..1, steps remaining) whose canvas is about as noisy as t."""
        return max(1, min(self.steps, math.ceil(t * self.steps)))

    def tempered(self, logits: torch.Tensor, cur_step: int) -> torch.Tensor:
        return self.temperature(None, logits, cur_step)

    def step(self, z: torch.Tensor, tempered: torch.Tensor, cur_step: int, gen: torch.Generator) -> torch.Tensor:
        probs = torch.softmax(tempered, dim=-1, dtype=torch.float32)
        draw = torch.multinomial(probs.flatten(0, 1).to(gen.device), 1, generator=gen).view(z.shape).to(z.device)
        accepted = self.sampler.accept_canvas(z, draw, tempered, cur_step)
        noise = torch.randint(0, self.vocab, z.shape, generator=gen, device=gen.device).to(z.device)
        return torch.where(self.sampler.accepted_token_mask, accepted, noise)


def draw_cache_age(probs: list[float], gen: torch.Generator) -> int:
    return int(torch.multinomial(torch.tensor(probs, dtype=torch.float64, device=gen.device), 1, generator=gen))


def posttrain_loss(split: SplitDiffusionGemma, fusion, batch: CanvasBatch, gen: torch.Generator, cfg,
                   rollout: Rollout, fresh: bool = False) -> tuple[torch.Tensor, dict]:
    """CE + KD of the fused prediction at an on-policy state with a k-step-old anchor
    (`fresh`: the fresh-anchor control -- the same draws and loss, the anchor always recomputed).

    `fusion` may be DDP-wrapped; `cfg` is the posttrain config section.
    """
    if fresh:
        return _fresh_anchor_loss(split, fusion, batch, gen, cfg, rollout)
    with torch.no_grad():
        z, step, inputs = _on_policy_start(split, batch, gen, rollout)
        sc = None
        if float(torch.rand((), generator=gen, device=gen.device)) < cfg.self_cond_p:
            sc = rollout.tempered(split.denoise(split.anchor(split.shared(z, inputs), inputs), inputs), step)
        c0 = split.shared(z, inputs, sc)
        h0 = split.anchor(c0, inputs)
        k = draw_cache_age(cfg.cache_age_probs, gen)
        logits, c = split.denoise(h0, inputs), c0
        for j in range(k):  # the sampler under the cache policy, stop-gradient
            sc = rollout.tempered(logits, step)
            z = rollout.step(z, sc, step, gen)
            step = max(1, step - 1)
            c = split.shared(z, inputs, sc)
            if j < k - 1:
                logits = split.denoise(fusion(c, c0, h0), inputs)
        teacher = split.denoise(split.anchor(c, inputs), inputs) if k else logits
    fused = fusion(c, c0, h0)
    # k = 0: c is C0, so the fused state is H0 exactly and the student is the teacher; the zero
    # term keeps every fusion parameter in the graph (zero gradients, as DDP expects)
    student = split.denoise(fused, inputs) if k else logits + 0.0 * (fused - h0).sum()
    return _ce_kd(student, teacher, batch, cfg, k)


def _on_policy_start(split: SplitDiffusionGemma, batch: CanvasBatch, gen: torch.Generator, rollout: Rollout
                     ) -> tuple[torch.Tensor, int, object]:
    """The start both losses share (call it under no_grad): the context's encoder cache, then the
    draws in this order -- antithetic times, the uniform noise z_t -- the rollout step of the mean
    time, and the decoder inputs. Returns (z, step, inputs)."""
    cache = encoder_cache(split.base, batch)
    t = antithetic_times(len(batch.target), gen, batch.target.device)
    z = uniform_noise(batch.target, t, split.text_config.vocab_size, gen)
    step = rollout.cur_step(float(t.mean()))
    inputs = split.prepare(z, cache, batch.decoder_mask)  # shapes and cache only: the same for every pass after
    return z, step, inputs


def _ce_kd(student: torch.Tensor, teacher: torch.Tensor, batch: CanvasBatch, cfg, k: int) -> tuple[torch.Tensor, dict]:
    """CE on the targets + kd_weight * KD to the teacher at kd_temperature, and the logged terms."""
    tau = cfg.kd_temperature
    ce = F.cross_entropy(student.flatten(0, 1), batch.target.flatten())
    kd = F.kl_div(F.log_softmax(student / tau, -1).flatten(0, 1), F.log_softmax(teacher / tau, -1).flatten(0, 1),
                  log_target=True, reduction="batchmean") * tau**2
    # the logged terms stay on the device: the loop reads them once per logged step
    return ce + cfg.kd_weight * kd, {"ce": ce.detach(), "kd": kd.detach(), "age": k}


def _fresh_anchor_loss(split: SplitDiffusionGemma, fusion, batch: CanvasBatch, gen: torch.Generator, cfg,
                       rollout: Rollout) -> tuple[torch.Tensor, dict]:
    """:func:`posttrain_loss` of the fresh-anchor control: the draws in the same order, the
    policy D(Phi(c; c, A(c))) at every step (no anchor reuse), the same CE + KD."""
    with torch.no_grad():
        z, step, inputs = _on_policy_start(split, batch, gen, rollout)

        def policy(c):
            h = split.anchor(c, inputs)
            return split.denoise(fusion(c, c, h), inputs), h

        sc = None
        if float(torch.rand((), generator=gen, device=gen.device)) < cfg.self_cond_p:
            sc = rollout.tempered(policy(split.shared(z, inputs))[0], step)
        c = split.shared(z, inputs, sc)
        h = split.anchor(c, inputs)
        k = draw_cache_age(cfg.cache_age_probs, gen)  # drawn as in TADM's loss: the same random stream
        if k:
            logits = split.denoise(fusion(c, c, h), inputs)
        for j in range(k):  # the control's own sampler, stop-gradient
            sc = rollout.tempered(logits, step)
            z = rollout.step(z, sc, step, gen)
            step = max(1, step - 1)
            c = split.shared(z, inputs, sc)
            h = split.anchor(c, inputs)
            if j < k - 1:
                logits = split.denoise(fusion(c, c, h), inputs)
        teacher = split.denoise(h, inputs)
    student = split.denoise(fusion(c, c, h), inputs)
    return _ce_kd(student, teacher, batch, cfg, k)
