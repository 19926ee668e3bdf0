"""The files a hub directory carries for ``trust_remote_code`` (copied byte for byte):
``configuration_tadm``, ``modeling_tadm``, ``generation_tadm`` (`tadm.hub.export`, the pretraining
models) and ``configuration_tadm_posttrain``, ``modeling_tadm_posttrain`` (`tadm.hub.export_fusion`,
TADM:Post-train's fusion on its DiffusionGemma base). They import only torch, transformers, the
standard library and each other (relatively), never ``tadm``."""

from pathlib import Path

REMOTE_DIR = Path(__file__).resolve().parent
REMOTE_FILES = ("configuration_tadm.py", "modeling_tadm.py", "generation_tadm.py")
FUSION_REMOTE_FILES = ("configuration_tadm_posttrain.py", "modeling_tadm_posttrain.py")
