"""Projected training MFU and sampling tokens/s at the paper profile on an H100 and an H200,
from the step-time model `tadm.step_time` (its assumptions are in its docstring): what the
code does today (compiled readout chunks, the residual stream as train.residual says) against
the code before the first-GPU-day changes, and with the bf16 residual stream train.residual offers.

    python benchmarks/step_time.py            # prints the tables, writes benchmarks/results/step_time.md
    python benchmarks/step_time.py --check    # exit 1 if the results file differs from a fresh render

No GPU has measured any of it: benchmarks/gpu_check (a) measures training MFU, (c) sampling
tokens/s; where they disagree with this file, the model's efficiencies are what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tadm import config  # noqa: E402
from tadm.step_time import H100, H200, Code, sampling_step, training_step  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "step_time.md"
NOW = Code()
TRAINING = [  # (label, code)
    ("before: boolean-mask gathers (3 host syncs per micro-batch), heads checkpointed, eager readout",
     Code(host_syncs=3, capacity_rows=False, kept_logits=False, compiled_head=False)),
    ("before, blocks eager (runtime.compile off)",
     Code(host_syncs=3, capacity_rows=False, kept_logits=False, compiled_head=False, compiled_blocks=False)),
    ("fixed-capacity gathers (no sync), heads kept, eager readout", Code(compiled_head=False)),
    ("now: + compiled readout chunks (head + cross-entropy), train.residual fp32 (the paper profile)", NOW),
    ("now, train.residual bf16 (a bf16 residual stream)", dataclasses.replace(NOW, residual_bytes=2)),
]
SAMPLING = [
    ("before: a host read every step, eager", Code(sampling_plan=False, compiled_blocks=False)),
    ("before, CUDA graphs", Code(sampling_plan=False, compiled_blocks=False, cuda_graphs=True)),
    ("now: masks drawn ahead (no read per step), eager", Code(compiled_blocks=False)),
    ("now, CUDA graphs", Code(compiled_blocks=False, cuda_graphs=True)),
    ("now, compiled blocks (runtime.compile, batch >= 8)", Code()),
]


def render() -> str:
    p = config.from_dict(config.render_profile("paper"))
    gpus = (H100, H200)
    lines = ["# Projected step times at the paper profile (tadm.step_time; no GPU has measured them)", ""]
    lines += [f"Training: one micro-batch of {p.train.micro_batch} x {p.packing.seq_len} tokens per process, "
              f"{p.runtime.nproc} processes, global batch {p.train.global_batch}; MFU = model FLOPs "
              "(tadm.compute) / (time x bf16 peak).", ""]
    lines += ["| run | code | " + " | ".join(f"{g.name}: ms / MFU" for g in gpus) + " |",
              "|---|---|" + "---|" * len(gpus)]
    for kind in ("tadm", "mdlm", "adlm"):
        for label, code in TRAINING:
            cells = []
            for g in gpus:
                s = training_step(kind, p, g, code)
                cells.append(f"{s.seconds * 1e3:.1f} / {s.mfu:.1%}")
            lines.append(f"| {kind} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "Where a TADM micro-batch's time goes now (H100, ms):", ""]
    s = training_step("tadm", p, H100, NOW)
    lines += ["| " + " | ".join(s.parts) + " |", "|" + "---|" * len(s.parts),
              "| " + " | ".join(f"{v * 1e3:.1f}" for v in s.parts.values()) + " |", ""]
    steps = 1024
    lines += [f"Sampling: TADM (K = 8) and MDLM, T = {steps} steps over a canvas of {p.sample.canvas_length}, "
              "generated tokens / s (a trajectory's tokens over its time).", ""]
    lines += ["| batch | code | " + " | ".join(f"{g.name}: TADM K=8 / MDLM" for g in gpus) + " |",
              "|---|---|" + "---|" * len(gpus)]
    for batch in (1, 64):
        for label, code in SAMPLING:
            if batch < 8 and code.compiled_blocks:
                continue  # runtime.compile compiles the sampling blocks from batch 8 only
            cells = []
            for g in gpus:
                tadm = sampling_step("tadm", p, g, batch, steps, 8, code)
                mdlm = sampling_step("mdlm", p, g, batch, steps, 1, code)
                cells.append(f"{tadm.tokens_per_s:,.0f} / {mdlm.tokens_per_s:,.0f}")
            lines.append(f"| {batch} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with benchmarks/results/step_time.md")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not RESULTS.exists() or RESULTS.read_text() != text:
            print(f"{RESULTS.relative_to(ROOT)} is not what `python benchmarks/step_time.py` renders now", file=sys.stderr)
            return 1
        return 0
    print(text, end="")
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
