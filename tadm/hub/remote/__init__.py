"""The files a hub directory carries for ``trust_remote_code`` (copied byte for byte by
`tadm.hub.export`): ``configuration_tadm``, ``modeling_tadm``, ``generation_tadm``. They import
only torch, transformers, the standard library and each other (relatively), never ``tadm``."""

from pathlib import Path

REMOTE_DIR = Path(__file__).resolve().parent
REMOTE_FILES = ("configuration_tadm.py", "modeling_tadm.py", "generation_tadm.py")
