"""Building, loading and saving the DiffusionGemma base and the TADM fusion.

- ``small_config``: the default profile's DiffusionGemma (decoder depth = the posttrain split,
  MoE fields small, a one-layer vision tower the class always builds but text never uses).
- ``load_base``: ``DiffusionGemmaForBlockDiffusion.from_pretrained`` of a hub id or a local
  directory (the paper profile: DiffusionGemma-26B in bf16; the default profile: the
  checkpoint the ``dg_base`` stage wrote), read in its precision straight onto its device
  (no full fp32 copy on the host per process). Frozen, eval mode.
- ``save_fusion`` / ``load_fusion``: the fusion's weights as safetensors next to a JSON record
  of its shape, the split, its kind (TADM's or the fresh-anchor control's values) and the base
  it belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tadm.config import Params
from tadm.errors import ConfigError, DataError
from tadm.io import atomic_path, atomic_write_json
from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma
from tadm.posttrain.backbone import SplitDiffusionGemma
from tadm.posttrain.fusion import PairedAttentionFusion
from tadm.runtime import CPU, host

BASE_DIR = Path("models/dg_base")  # the default profile's trained base
TADM_DIR = Path("models/dg_tadm")  # the trained fusion
FRESH_DIR = Path("models/dg_fresh")  # Table 1's control: the same recipe, the anchor always fresh
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def small_config(p: Params, vocab_size: int, eos_id: int, pad_id: int):
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig, Gemma4VisionConfig

    b, pt = p.posttrain.base, p.posttrain
    depth = pt.shared_layers + pt.anchor_layers + pt.denoiser_layers
    # Gemma's 5:1 sliding / full attention pattern, the last layer full as DiffusionGemma requires
    kinds = ["full_attention" if (i + 1) % 6 == 0 or i == depth - 1 else "sliding_attention" for i in range(depth)]
    text = DiffusionGemmaTextConfig(
        layer_types=kinds,
        vocab_size=vocab_size, hidden_size=b.hidden_size, intermediate_size=b.intermediate_size,
        num_hidden_layers=depth,
        num_attention_heads=b.num_attention_heads, num_key_value_heads=b.num_key_value_heads,
        head_dim=b.head_dim, global_head_dim=b.head_dim, sliding_window=b.sliding_window,
        num_experts=b.num_experts, top_k_experts=b.top_k_experts, moe_intermediate_size=b.moe_intermediate_size,
        max_position_embeddings=4 * pt.max_context_tokens + 4 * pt.canvas_length,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=eos_id)
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
                                num_key_value_heads=1, head_dim=16)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=pt.canvas_length,
                                eos_token_id=eos_id, pad_token_id=pad_id)


def base_source(p: Params, root: Path = Path(".")) -> str:
    """Where the base comes from: the pipeline's checkpoint or posttrain.base_model (a local
    directory exactly when posttrain.base_model is "local": pass ``local=`` to :func:`load_base`)."""
    return str(root / BASE_DIR) if p.posttrain.base_model == "local" else p.posttrain.base_model


def load_base(source: str | Path, precision: str = "fp32", device: str | torch.device = CPU, *, local: bool = False):
    """The frozen DiffusionGemmaForBlockDiffusion from a hub id or a local directory (`local`:
    `source` is a directory whatever it reads like -- the pipeline's ``models/dg_base`` reads
    like a hub id -- and a missing one is a one-line error, never a hub lookup).

    The weights are read in `precision` (the paper: bf16) and placed directly on `device`
    (``device_map={"": device}``, low-memory loading), so that each of N processes holds only
    its GPU copy, not a full-precision copy of a 26B model in host memory."""
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from transformers import DiffusionGemmaForBlockDiffusion

    is_local = local
    local = Path(source).expanduser()
    if (is_local or str(source).startswith((".", "/", "~")) or local.exists()) and not (local / "config.json").is_file():
        raise DataError(f"{local}: no DiffusionGemma checkpoint here (config.json missing; run dvc repro train, or alone: python -m tadm dg-base)")
    device = torch.device(device)
    if local.exists():  # bound config.json against the weights' header before building
        # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
        from tadm.weights_header import check_hf_directory

        check_hf_directory(local, f"posttrain base {str(source)!r}", DTYPES[precision].itemsize, device)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(local) if local.exists() else str(source),
                                                            dtype=DTYPES[precision], low_cpu_mem_usage=True,
                                                            device_map={"": device})
    return model.eval().requires_grad_(False)


def build_tadm(base, p: Params, fresh: bool = False) -> TimeAnchoredDiffusionGemma:
    """Split the base 2/20/8-style and attach a new fusion (zero-initialised up-projection);
    `fresh`: Table 1's fresh-anchor control (values read the current shallow state)."""
    pt = p.posttrain
    split = SplitDiffusionGemma(base, pt.shared_layers, pt.anchor_layers, pt.denoiser_layers)
    with torch.device(base.device):
        fusion = PairedAttentionFusion(split.hidden_size, pt.fusion_rank, pt.gate_bias_init,
                                       values="state" if fresh else "change")
    return TimeAnchoredDiffusionGemma(split, fusion)


def save_fusion(tadm: TimeAnchoredDiffusionGemma, out_dir: Path, base: str, extra: dict | None = None) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: host(v).float().contiguous() for k, v in tadm.fusion.state_dict().items()}
    with atomic_path(out_dir / "fusion.safetensors") as tmp:
        save_file(weights, str(tmp))
    record = {"hidden_size": tadm.fusion.hidden_size, "rank": tadm.fusion.rank, "split": list(tadm.split.split),
              "values": tadm.fusion.values, "base_model": base, "parameters": tadm.fusion.num_parameters, **(extra or {})}
    atomic_write_json(out_dir / "fusion.json", record)


def load_fusion(tadm: TimeAnchoredDiffusionGemma, fusion_dir: Path) -> dict:
    """Load trained fusion weights into `tadm`; check they were made for this split and size."""
    fusion_dir = Path(fusion_dir)
    record_path, weights_path = fusion_dir / "fusion.json", fusion_dir / "fusion.safetensors"
    if not record_path.is_file() or not weights_path.is_file():
        raise DataError(f"{fusion_dir}: fusion.json / fusion.safetensors missing (run dvc repro train, or alone: python -m tadm dg-posttrain)")
    record = json.loads(record_path.read_text())
    have = {"hidden_size": tadm.fusion.hidden_size, "rank": tadm.fusion.rank, "split": list(tadm.split.split),
            "values": tadm.fusion.values}
    for key, value in have.items():
        if record.get(key, "change" if key == "values" else None) != value:  # records before the control: "change"
            raise ConfigError(f"posttrain ({key})", f"{fusion_dir} was trained with {key}={record.get(key)}, the model has {value}")
    tadm.fusion.load_state_dict({k: v.to(tadm.fusion.q.weight.dtype) for k, v in load_file(str(weights_path)).items()})
    return record
