"""What Table 1 and the ASRD comparison share on DiffusionGemma: loading the frozen base with its
trained fusions (`load_models`), the prompts' chat encoding and the completions' decoding
(`PromptIO`), and the probes that measure a generation: decoder-layer calls
(`DecoderLayerCalls`, the paper's compute unit), the time and FLOPs of the per-step decoder
calls (`DecoderProbe`), and a FLOP counter that sees the CPU attention kernel and the MoE's
grouped matmuls, torch's and transformers' fallback (`FlopCount`, `count_flops`).

    base, tadm, fresh, tok = load_models(p, root)
    io = PromptIO(tok, device)
    ids, mask = io.encode(["What is 2 + 3?"])           # left-padded no-think chat turns
    texts = io.decode(tadm.generate(ids, mask, ...).sequences, ids.shape[1])
    with DecoderProbe(tadm) as probe: ...                # probe.seconds, probe.flops
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
import transformers.integrations.moe  # noqa: F401  (registers the op _transformers_grouped_mm counts; transformers loads lazily)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count, shape_wrapper

from tadm import runtime
from tadm.config import Params
from tadm.data import chat
from tadm.data.tokenizer import load_tokenizer
from tadm.posttrain import model as dgm
from tadm.posttrain.data import left_pad


# ----------------------------------------------------------------------------- FLOPs

def _cpu_attention_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _grouped_mm_flops(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *args, out_val=None,
                      **kwargs) -> int:
    """`torch._grouped_mm`, the MoE experts' matmul of transformers: groups of rows of `a` (or of
    the shared dimension) each times their own matrix of `b`; `offs` ends the groups, so only
    offs[-1] rows (columns) take part."""
    if a.dim() == 3 and b.dim() == 3:  # one (m, k) @ (k, n) per group
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    used = int(offs[-1]) if offs is not None and offs.numel() else None
    if a.dim() == 2 and b.dim() == 3:  # row groups of a: (offs[-1], k) rows, each group @ its (k, n)
        return 2 * (a.shape[0] if used is None else used) * a.shape[1] * b.shape[2]
    if a.dim() == 2 and b.dim() == 2:  # groups along k: (m, k_g) @ (k_g, n), summed over groups
        return 2 * a.shape[0] * (a.shape[1] if used is None else used) * b.shape[1]
    # a (g, m, k) @ column groups of b (k, n_g)
    return 2 * a.shape[1] * a.shape[2] * (b.shape[1] if used is None else used)


def _transformers_grouped_mm() -> dict:
    """transformers' own grouped matmul, the custom op ``transformers::grouped_mm_fallback`` (a
    loop of mm, rows of `input` grouped by `offs` as in torch._grouped_mm) that its MoE experts
    run where torch's kernel cannot: under torch.compile below bf16, CUDA before compute
    capability 8.0, CPU weights on torch <= 2.10 that are not 16-byte aligned (memory-mapped
    safetensors). A dispatch mode sees it as one op, not its mms; {} where it is not registered."""
    op = getattr(torch.ops.transformers, "grouped_mm_fallback", None)
    return {op: _grouped_mm_flops} if op is not None else {}


# torch's counter knows the CUDA attention kernels but not the CPU one, and no grouped matmul (the
# MoE experts of DiffusionGemma: without it every expert FLOP would be missing); count them too.
# The grouped matmul's formula reads offs's values, so it takes the tensors, not their shapes.
_FORMULAS = {**flop_registry,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: shape_wrapper(_cpu_attention_flops),
             torch.ops.aten._grouped_mm: _grouped_mm_flops,
             **_transformers_grouped_mm()}


class FlopCount(TorchDispatchMode):
    """Counts the floating-point operations (matmuls, attention, grouped matmuls) of every op run
    inside it with torch's formulas (`torch.utils.flop_counter`). The total of FlopCounterMode
    (tests/posttrain check they agree on a whole ``generate``), without its per-module breakdown
    and op decompositions, which made counting a ``generate`` 1.4x slower."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = _FORMULAS.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of `fn()` (matmuls and attention), as torch counts them."""
    with FlopCount() as counter:
        fn()
    return counter.total


# ----------------------------------------------------------------------------- probes

class DecoderLayerCalls:
    """Counts calls of the base's canvas-decoder layers (the paper's compute unit) with forward
    hooks, whichever path -- transformers' decoder or the S / A / D split -- makes them."""

    def __init__(self, base):
        self.calls = 0
        self._hooks = [layer.register_forward_hook(self._hook) for layer in base.model.decoder.layers]

    def _hook(self, *_):
        self.calls += 1

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


class DecoderProbe:
    """Time (and optionally FLOPs) spent in the per-step decoder calls of ``generate``.

    ``generate`` calls ``self.forward`` of the model once per denoising step; the probe shadows
    that attribute with a timed wrapper for the duration of a ``with`` block.
    """

    def __init__(self, owner, count_flops: bool = False):
        self.owner, self.count_flops = owner, count_flops
        self.seconds, self.flops = 0.0, 0

    def __enter__(self) -> "DecoderProbe":
        inner = self.owner.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if self.count_flops:
                with FlopCount() as counter:
                    out = inner(*args, **kwargs)
                self.flops += counter.total
            else:
                out = inner(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            return out

        self.owner.forward = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.owner.forward  # the class's forward again


# ----------------------------------------------------------------------------- loading and prompts

def fusion_model(base, p: Params, directory: Path, fresh: bool = False):
    """A TimeAnchoredDiffusionGemma on `base` with the trained fusion saved in `directory`."""
    model = dgm.build_tadm(base, p, fresh=fresh)
    dgm.load_fusion(model, directory)
    model.fusion.to(dtype=base.dtype).eval()
    return model


def load_models(p: Params, root: Path = Path("."), dist: runtime.Dist | None = None, control: bool = True):
    """The frozen base, TADM with its trained fusion (models/dg_tadm), the fresh-anchor control
    (models/dg_fresh; None unless `control`) and the tokenizer, on the device of `dist` (None:
    `runtime.setup(p.runtime)`)."""

    source = dgm.base_source(p, root)
    local = p.posttrain.base_model == "local"
    if local and not (Path(source) / "config.json").is_file():  # before any process group is set up
        dgm.load_base(source, local=True)  # its one-line error
    d = dist or runtime.setup(p.runtime)
    base = dgm.load_base(source, p.posttrain.precision, d.device, local=local)
    fresh = fusion_model(base, p, root / dgm.FRESH_DIR, fresh=True) if control else None
    return base, fusion_model(base, p, root / dgm.TADM_DIR), fresh, load_tokenizer(source)


class PromptIO:
    """A tokenizer's prompts in and completions out, on `device`: prompts become the no-think chat
    turns of the SFT canvases, left-padded; a completion ends at the first EOS."""

    def __init__(self, tokenizer, device: torch.device = runtime.CPU):
        self.tok, self.device = tokenizer, device
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos

    def encode(self, prompts: list[str]):
        """(ids (B, P), attention mask (B, P)) of `prompts`, left-padded, on the device."""
        ids = chat.encode_prompts(self.tok, prompts)
        x, m = left_pad(ids, self.pad)
        return x.to(self.device), m.to(self.device)

    def decode(self, sequences: torch.Tensor, prompt_len: int) -> list[str]:
        """The completions of `sequences` (B, P + N): the tokens after the prompt, up to EOS."""
        texts = []
        for row in sequences[:, prompt_len:].tolist():
            if self.eos in row:
                row = row[: row.index(self.eos)]
            texts.append(self.tok.decode(row, skip_special_tokens=True))
        return texts
