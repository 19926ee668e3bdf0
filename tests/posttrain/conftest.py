"""A tiny random DiffusionGemma (the real transformers class, no download) for the post-train tests."""

import pytest
import torch

from tests.conftest import torch_single_thread

VOCAB, CANVAS = 64, 8


def tiny_config(layers: int = 6, vocab: int = VOCAB, canvas: int = CANVAS):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig, Gemma4VisionConfig

    text = DiffusionGemmaTextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                                    sliding_window=32, num_experts=4, top_k_experts=2, moe_intermediate_size=16,
                                    eos_token_id=1, pad_token_id=0, bos_token_id=2)
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                                num_key_value_heads=1, head_dim=16)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas, eos_token_id=1, pad_token_id=0)


@pytest.fixture(scope="module")
def tiny_base():
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(tiny_config()).eval().requires_grad_(False)


single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)
