"""AR: a causal Transformer of MDLM's size, next-token cross-entropy (an exact NLL); no mask token,
and its own sampling loop (tadm.sampling.ar.sample_ar), so no adapter."""

from __future__ import annotations

from tadm.losses import ar_nll
from tadm.methods.base import Method, Row
from tadm.models.ar import AR


class ARMethod(Method):
    names = ("ar",)
    title = "AR (causal Transformer)"  # the family as the paper and its tables write it
    model = AR
    masked = False
    rows = (Row("ar", "AR", "ar", "ar"),)

    def nelbo(self, model, x, gen):
        return ar_nll(model(x), x)

    @classmethod
    def forward_flops(cls, name, cfg, vocab_size, seq_len, head_rows):
        # the head reads every position: every token predicts the next one
        return super().forward_flops(name, cfg, vocab_size, seq_len, 1.0)

    def train_head_rows(self, tokens, readout_rows):
        return [tokens]  # next-token prediction at every position

