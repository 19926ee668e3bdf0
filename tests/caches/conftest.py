"""The post-train tests' tiny random DiffusionGemma (the real transformers class), shared here."""

from tests.posttrain.conftest import single_thread, tiny_base  # noqa: F401  (fixtures)
