"""One class per training method behind a shared interface (the trainer knows no method).

A method builds its model and turns a batch of clean sequences into a per-sequence loss
(B,) in nats. ``loss`` is what is optimised; ``nelbo`` is the validation bound reported for
every method on the same footing (nats per sequence; the trainer divides by tokens):

- MDLM: the continuous-time NELBO with the SUBS parameterisation.
- ADLM: the denoiser's NELBO + gamma (ramped) * the anchor loss on important tokens; the
  bound is the denoiser's NELBO.
- TADM (gamma = train.gamma, "double dagger") and TADM-gamma0 ("dagger"): the T-ANELBO on a
  stale-anchor pair (t, t'); the bound is the NELBO with a fresh anchor (k = 0). With
  gamma = 0 the training-only anchor head is frozen: nothing ever updates it.
- SEDD: the absorbing score-entropy loss (itself an upper bound on the NLL).
- AR: next-token cross-entropy (an exact NLL).

Every diffusion objective reads only the positions masked in z_t (SUBS: an unmasked position
contributes exactly 0), so the methods hand the model a `Readout` (tadm.losses): its LM head
and the cross-entropy run, chunked, on the masked rows only, inside the model's forward (a
DDP-wrapped model sees its head used through forward). The full-logits definitions in
tadm.losses remain the reference they are tested against (tests/test_losses_fast.py).
"""

from __future__ import annotations

import torch

from tadm.config import Params
from tadm.errors import ConfigError
from tadm.forward_process import mask_tokens, sample_times, stale_pair
from tadm.losses import (
    adlm_anchor_readout, ar_nll, nelbo_from_rows, sedd_readout, sedd_score_entropy_rows, subs_readout, t_anelbo_rows,
)
from tadm.models import build_model
from tadm.schedule import LogLinearSchedule

EPS = 1e-3  # MDLM's schedule / time-sampling epsilon
# ADLM's anchor weight as released (LituRout/ADLM, adlm_diffusion.py: gamma = min(3e-3,
# global_step / max_steps * 1.0)): it grows as the fraction of training done and is capped at
# train.gamma, so it reaches 3e-3 after 0.3 % of the steps
ADLM_RAMP_SLOPE = 1.0


class Method:
    model_type: str = ""

    def __init__(self, name: str, p: Params):
        self.name, self.p = name, p
        self.schedule = LogLinearSchedule(EPS)

    def build_model(self, vocab_size: int, seq_len: int) -> torch.nn.Module:
        self.mask_id = vocab_size
        return build_model(self.model_type, self.p.model, vocab_size, seq_len)

    def _noised(self, x: torch.Tensor, gen: torch.Generator):
        t = sample_times(x.shape[0], EPS, True, gen, x.device)
        z_t = mask_tokens(x, self.schedule.alpha(t), self.mask_id, gen)
        return t, z_t

    def loss(self, model, x: torch.Tensor, gen: torch.Generator, progress: float = 1.0) -> torch.Tensor:
        return self.nelbo(model, x, gen)

    def nelbo(self, model, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        raise NotImplementedError


class MDLMMethod(Method):
    model_type = "mdlm"

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce = model(z_t, readout=subs_readout(z_t, x, self.mask_id))
        return nelbo_from_rows(ce, t, self.schedule)


class ADLMMethod(Method):
    model_type = "adlm"

    def _terms(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce, anchor_logits = model(z_t, readout=subs_readout(z_t, x, self.mask_id))
        return nelbo_from_rows(ce, t, self.schedule), anchor_logits, z_t, t

    def loss(self, model, x, gen, progress=1.0):
        nelbo, anchor_logits, z_t, t = self._terms(model, x, gen)
        gamma = min(self.p.train.gamma, ADLM_RAMP_SLOPE * progress)
        anchor_ce = adlm_anchor_readout(z_t, x, self.mask_id)(anchor_logits)
        return nelbo + gamma * nelbo_from_rows(anchor_ce, t, self.schedule)

    def nelbo(self, model, x, gen):
        return self._terms(model, x, gen)[0]


class TADMMethod(Method):
    model_type = "tadm"

    def __init__(self, name: str, p: Params, gamma: float):
        super().__init__(name, p)
        self.gamma = gamma

    def build_model(self, vocab_size, seq_len):
        model = super().build_model(vocab_size, seq_len)
        if self.gamma == 0:  # TADM-dagger: the anchor head is never trained
            model.anchor_head.requires_grad_(False)
        return model

    def loss(self, model, x, gen, progress=1.0):
        t = sample_times(x.shape[0], EPS, True, gen, x.device)
        pair = stale_pair(x, t, self.schedule, self.mask_id, self.p.train.refresh_choices,
                          self.p.train.budget_choices, gen)
        readout = subs_readout(pair.z_t, x, self.mask_id)
        if self.gamma > 0:  # the anchor head scores the rows masked in z_t'
            ce, anchor_ce = model(pair.z_t, pair.z_tprime, readout=readout,
                                  anchor_readout=subs_readout(pair.z_tprime, x, self.mask_id))
        else:
            ce, anchor_ce = model(pair.z_t, pair.z_tprime, readout=readout), None
        total, _ = t_anelbo_rows(ce, anchor_ce, pair, self.schedule, self.gamma)
        return total

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce = model(z_t, z_t, readout=subs_readout(z_t, x, self.mask_id))  # fresh anchor: cache age 0
        return nelbo_from_rows(ce, t, self.schedule)


class SEDDMethod(Method):
    model_type = "sedd"

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        return sedd_score_entropy_rows(model(z_t, readout=sedd_readout(z_t, x, self.mask_id)), t, self.schedule)


class ARMethod(Method):
    model_type = "ar"

    def nelbo(self, model, x, gen):
        return ar_nll(model(x), x)


def get_method(name: str, p: Params) -> Method:
    """The method behind a run name of train.models."""
    table = {
        "mdlm": lambda: MDLMMethod(name, p),
        "adlm": lambda: ADLMMethod(name, p),
        "tadm": lambda: TADMMethod(name, p, gamma=p.train.gamma),
        "tadm_gamma0": lambda: TADMMethod(name, p, gamma=0.0),
        "sedd": lambda: SEDDMethod(name, p),
        "ar": lambda: ARMethod(name, p),
    }
    if name not in table:
        raise ConfigError("train.models", f"unknown run {name!r}; allowed: {', '.join(table)}")
    return table[name]()
