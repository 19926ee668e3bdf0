"""SEDD, absorbing (Lou et al., 2024): MDLM's network trained with the score-entropy loss (itself
an upper bound on the NLL), sampled with its analytic sampler."""

from __future__ import annotations

from tadm.losses import sedd_readout, sedd_score_entropy_rows
from tadm.methods.base import Method, Row
from tadm.models.sedd import SEDD
from tadm.sampling.adapters import SEDDAdapter


class SEDDMethod(Method):
    names = ("sedd",)
    title = "SEDD (score entropy, absorbing)"  # the family as the paper and its tables write it
    model = SEDD
    adapter = SEDDAdapter
    rows = (Row("sedd", "SEDD", "sedd", "sedd-analytic"),)

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        readout = self.readout(z_t, x, build=sedd_readout)
        return sedd_score_entropy_rows(model(z_t, readout=readout), t, self.schedule)
