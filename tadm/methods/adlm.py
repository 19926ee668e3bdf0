"""ADLM (Rout et al., 2025): an anchor network predicts important tokens, its distribution feeds
a denoiser; both run at every step. The loss is the denoiser's NELBO + gamma (ramped) x the anchor
loss on important tokens; the validation bound is the denoiser's NELBO."""

from __future__ import annotations

from tadm import compute
from tadm.losses import adlm_anchor_readout, nelbo_from_rows
from tadm.methods.base import AnchoredMethod, Row
from tadm.models.adlm import ADLM
from tadm.sampling.adapters import ADLMAdapter

# ADLM's anchor weight as released (LituRout/ADLM, adlm_diffusion.py: gamma = min(3e-3,
# global_step / max_steps * 1.0)): it grows as the fraction of training done and is capped at
# train.gamma, so it reaches 3e-3 after 0.3 % of the steps
ADLM_RAMP_SLOPE = 1.0


class ADLMMethod(AnchoredMethod):
    names = ("adlm",)
    title = "ADLM (anchored diffusion)"  # the family as the paper and its tables write it
    model = ADLM
    adapter = ADLMAdapter
    steps_in_objective = True  # the ramp reads step / train.steps
    compute_column = True
    rows = (Row("adlm", "ADLM", "adlm", "remdm-loop", speed_reference=0),)  # TADM's speed is given against it first

    def _terms(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce, anchor_logits = model(z_t, readout=self.readout(z_t, x))
        return nelbo_from_rows(ce, t, self.schedule), anchor_logits, z_t, t

    def loss(self, model, x, gen, progress=1.0):
        nelbo, anchor_logits, z_t, t = self._terms(model, x, gen)
        gamma = min(self.p.train.gamma, ADLM_RAMP_SLOPE * progress)
        anchor_ce = adlm_anchor_readout(z_t, x, self.mask_id, compile=self.compile_heads)(anchor_logits)
        return nelbo + gamma * nelbo_from_rows(anchor_ce, t, self.schedule)

    def nelbo(self, model, x, gen):
        return self._terms(model, x, gen)[0]

    @classmethod
    def graphed_pieces(cls, model):
        return [model.anchor_final, model.denoiser_in]  # the anchor's head and the input map, on the whole canvas

    @classmethod
    def joint_parameters(cls, m, vocab_size):
        return cls.vocabulary(vocab_size) * m.d_model + m.d_model  # Linear(V', d) reading the anchor's logits

    @classmethod
    def forward_flops(cls, name, cfg, vocab_size, seq_len, head_rows):
        # anchor + its head on every row + input map V+1 -> d + denoiser + its head on the rows
        head = compute.lm_head_flops(cfg.d_model, vocab_size + 1)
        return cls.layers(cfg) * compute.dit_block_flops(cfg.d_model, seq_len, cfg.mlp_ratio) + head \
            + compute.dense_flops(vocab_size + 1, cfg.d_model) + head * head_rows

    def train_head_rows(self, tokens, readout_rows):
        return [tokens, readout_rows()]  # the anchor's head on every row, the denoiser's on its readout

    @classmethod
    def sampling_extra_flops(cls, m, vocab_size):
        # the anchor's head on every row and the input map V+1 -> d, every step
        return compute.lm_head_flops(m.d_model, vocab_size + 1) + compute.dense_flops(vocab_size + 1, m.d_model)
