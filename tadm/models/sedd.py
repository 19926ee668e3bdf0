"""SEDD (Lou et al., 2024), absorbing-state variant: the same network as MDLM.

Its (B, L, V+1) output is read as the log-score base, log s_theta(z_t)[y] for every candidate
token y; the score-entropy loss and the "analytic" sampler (which add the schedule terms) live
with the other losses and samplers, not here.
"""

from __future__ import annotations

from tadm.models.mdlm import MDLM


class SEDD(MDLM):
    model_type = "sedd"
