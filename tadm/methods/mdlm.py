"""MDLM (Sahoo et al., 2024): one bidirectional network, the continuous-time NELBO with the SUBS
parameterisation. Its trained network also serves the ReMDM, MDLM+FB and MDLM+DFM rows, which
differ only in the sampler."""

from __future__ import annotations

from tadm.losses import nelbo_from_rows
from tadm.methods.base import Method, Row
from tadm.models.mdlm import MDLM
from tadm.sampling.adapters import MDLMAdapter


class MDLMMethod(Method):
    names = ("mdlm",)
    title = "MDLM (masked diffusion)"  # the family as the paper and its tables write it
    model = MDLM
    adapter = MDLMAdapter
    compute_column = True
    asrd = True
    rows = (
        Row("mdlm", "MDLM", "mdlm", "mdlm", speed_reference=1),
        Row("mdlm_fb", "MDLM+FB", "mdlm", "mdlm-fb"),
        Row("mdlm_dfm", "MDLM+DFM", "mdlm", "mdlm-dfm"),
        Row("remdm", "ReMDM", "mdlm", "remdm-loop"),
    )

    def nelbo(self, model, x, gen):
        t, z_t = self._noised(x, gen)
        ce = model(z_t, readout=self.readout(z_t, x))  # (B,) summed over masked rows
        return nelbo_from_rows(ce, t, self.schedule)
