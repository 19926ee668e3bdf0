"""TADM:Pretraining (the paper): an expensive anchor A whose latent is cached and reused for K
steps, the shared network S (the token embedding), the fusion Phi and the denoiser D every step.

Two runs: TADM‡ ("tadm", gamma = train.gamma) and TADM† ("tadm_gamma0", gamma = 0: the
training-only anchor head is frozen, nothing ever updates it). The loss is the T-ANELBO on a
stale-anchor pair (t, t'); the validation bound is the NELBO with a fresh anchor (k = 0).
Sampling is Alg. 1 (`TADMAdapter`), with the refresh policy of sample.budgets' K.
"""

from __future__ import annotations

from tadm import compute, memory_estimate as mem
from tadm.forward_process import sample_times, stale_pair
from tadm.losses import nelbo_from_rows, t_anelbo_rows
from tadm.methods.base import EPS, AnchoredMethod, Row
from tadm.models.tadm import TADM
from tadm.sampling.adapters import TADMAdapter

GAMMA0_RUNS = ("tadm_gamma0",)  # runs that train without the anchor loss (TADM†)


class TADMMethod(AnchoredMethod):
    names = ("tadm", "tadm_gamma0")
    title = "TADM:Pretraining (time-anchored diffusion)"  # the family as the paper and its tables write it
    model = TADM
    adapter = TADMAdapter
    refreshes = True
    compute_column = True
    asrd = True
    rows = (
        Row("tadm_gamma0", "TADM† (γ=0)", "tadm_gamma0", "remdm-loop"),
        Row("tadm", "TADM‡ (γ=3e-3)", "tadm", "remdm-loop"),
        Row("tadm_nofusion", "TADM‡, fusion bypassed", "tadm", "remdm-loop", bypass_fusion=True),
    )

    def __init__(self, name, p):
        super().__init__(name, p)
        self.gamma = 0.0 if name in GAMMA0_RUNS else p.train.gamma
        # the largest t' - t = k / T of `stale_times`: (max K - 1) / min T
        self.stale_shift = (max(p.train.refresh_choices) - 1) / min(p.train.budget_choices)

    def build_model(self, vocab_size, seq_len):
        model = super().build_model(vocab_size, seq_len)
        if self.gamma == 0:  # TADM-dagger: the anchor head is never trained
            model.anchor_head.requires_grad_(False)
        return model

    def loss(self, model, x, gen, progress=1.0):
        t = sample_times(x.shape[0], EPS, True, gen, x.device)
        pair = stale_pair(x, t, self.schedule, self.mask_id, self.p.train.refresh_choices,
                          self.p.train.budget_choices, gen)
        readout = self.readout(pair.z_t, x)
        if self.gamma > 0:  # the anchor head scores the rows masked in z_t' (t' <= t + stale_shift)
            ce, anchor_ce = model(pair.z_t, pair.z_tprime, readout=readout,
                                  anchor_readout=self.readout(pair.z_tprime, x, self.stale_shift))
        else:
            ce, anchor_ce = model(pair.z_t, pair.z_tprime, readout=readout), None
        total, _ = t_anelbo_rows(ce, anchor_ce, pair, self.schedule, self.gamma)
        return total

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce = model(z_t, z_t, readout=self.readout(z_t, x))  # fresh anchor: cache age 0
        return nelbo_from_rows(ce, t, self.schedule)

    @classmethod
    def canvas_logits(cls, model, z):
        return model(z, z)  # a fresh anchor on the same canvas (cache age 0)

    @classmethod
    def make_adapter(cls, model, refresh=None, bypass_fusion=False):
        return TADMAdapter(model, refresh, bypass_fusion=bypass_fusion)

    @classmethod
    def joint_parameters(cls, m, vocab_size):
        return mem.fusion_parameters(m.d_model)  # the fusion Phi

    @classmethod
    def forward_flops(cls, name, cfg, vocab_size, seq_len, head_rows):
        # stale anchor + fusion + denoiser (+ the anchor head when gamma > 0)
        head = compute.lm_head_flops(cfg.d_model, vocab_size + 1)
        anchor_head = 0.0 if name in GAMMA0_RUNS else head * head_rows
        return cls.layers(cfg) * compute.dit_block_flops(cfg.d_model, seq_len, cfg.mlp_ratio) \
            + compute.fusion_flops(cfg.d_model) + head * head_rows + anchor_head

    @classmethod
    def layer_calls(cls, m, steps, refresh_every=1):
        # C_cache = T L_D + ceil(T / K) L_A
        return compute.cached_layer_calls(steps, refresh_every, m.anchor_layers, m.denoiser_layers)

    def train_head_rows(self, tokens, readout_rows):
        if self.name in GAMMA0_RUNS:  # TADM-dagger: the anchor head is not trained
            return [readout_rows()]
        return [readout_rows(), readout_rows(self.stale_shift)]  # D's on z_t, the anchor's on the staler z_t'

    @classmethod
    def train_extra_flops(cls, m, vocab_size):
        return compute.fusion_flops(m.d_model)  # the fusion Phi

    @classmethod
    def sampling_layers(cls, m, refresh_every=1):
        return m.denoiser_layers + m.anchor_layers / refresh_every  # the anchor once per K steps

    @classmethod
    def sampling_extra_flops(cls, m, vocab_size):
        return compute.fusion_flops(m.d_model)  # the fusion Phi, every step
