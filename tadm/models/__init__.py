"""Models: MDLM, ADLM, TADM, SEDD and AR on one shared DiT block, plus save / load.

    model = build_model("tadm", cfg, vocab_size, seq_len)
    model.save_pretrained("ckpt/")
    model = load_pretrained("ckpt/")
"""

from tadm.models.base import (
    MODEL_REGISTRY,
    CheckpointError,
    TadmModel,
    build_model,
    count_parameters,
)
from tadm.models.loading import load_pretrained
from tadm.models.mdlm import MDLM
from tadm.models.sedd import SEDD
from tadm.models.adlm import ADLM
from tadm.models.tadm import TADM
from tadm.models.ar import AR

__all__ = [
    "MODEL_REGISTRY", "CheckpointError", "TadmModel", "build_model", "count_parameters",
    "load_pretrained", "MDLM", "SEDD", "ADLM", "TADM", "AR",
]
