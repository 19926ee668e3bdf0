"""GPU-hour estimates of every paper table at the paper profile, from FLOP counts.

FLOPs come from `tadm.compute` (the per-token costs the sampling counters charge: DiT blocks
with their attention, LM heads on the rows they project, TADM's fusion, ADLM's input map),
multiplied by the work each table does at the paper profile's parameters (profiles/paper.yaml).
Training costs 3x the forward (backward = 2x). The LM head of the absorbing-state losses runs
on the masked rows only (E[masked fraction] = 1/2 under the log-linear schedule with uniform t).

Hours = FLOPs / (MFU x peak). The MFU of each kind of work is an assumption until
`benchmarks/gpu_check` has measured it on the GPU in question: if
benchmarks/results/gpu_check.json holds measured training MFU rows, their mean replaces the
training assumption (and the table says so).

    python benchmarks/gpu_hours.py                      # H100/H200 bf16 peak, Markdown table
    python benchmarks/gpu_hours.py --peak-tflops 312    # A100
    python benchmarks/gpu_hours.py --check              # + FlopCounterMode vs formula at a small size
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tadm import config  # noqa: E402
from tadm.compute import dense_flops, dit_block_flops, fusion_flops, lm_head_flops  # noqa: E402

MASKED = 0.5  # E[fraction of masked rows] in training (t ~ U(eps, 1), alpha_t = 1 - t)
MFU = {"train": 0.40, "sample": 0.20, "score": 0.40, "posttrain": 0.20, "generate": 0.10}
GPT2_LARGE = dict(d=1280, layers=36, vocab=50257)  # MAUVE features and Gen PPL (MDLM's evaluator)
DG_ACTIVE_PARAMS = 4.0e9  # DiffusionGemma-26B-A4B: ~4B parameters active per token
DG_LAYERS = 30  # decoder depth; the paper's split is 2 / 20 / 8
TABLE1_EXAMPLES = {"gsm8k": 1319, "humaneval": 164, "gpqa_diamond": 198, "mmlu_pro": 12032,
                   "livecodebench": 1055, "aime": 30}  # test-set sizes (LiveCodeBench v6 window: approx.)
LLADA_PARAMS = 8.0e9  # LLaDA-8B: parameters a token of a pass goes through
LLADA_PROMPT = {"gsm8k": 256, "humaneval": 192}  # assumed mean prompt tokens (question + chat template)


def network_forward(kind: str, m: config.ModelConfig, V: int, L: int, head_rows: float) -> float:
    """Forward FLOPs per token of one training pass; `head_rows` = fraction of rows the LM head sees."""
    blk = dit_block_flops(m.d_model, L, m.mlp_ratio)
    head = lm_head_flops(m.d_model, V + 1)
    if kind in ("mdlm", "sedd", "ar"):
        return m.mdlm_layers * blk + head * (1.0 if kind == "ar" else head_rows)
    if kind == "adlm":  # anchor + anchor head on every row + input map V+1 -> d + denoiser
        return (m.anchor_layers + m.denoiser_layers) * blk + head + dense_flops(V + 1, m.d_model) + head * head_rows
    if kind in ("tadm", "tadm_gamma0"):  # stale anchor + fusion + denoiser (+ anchor head when gamma > 0)
        anchor_head = head * head_rows if kind == "tadm" else 0.0
        return (m.anchor_layers + m.denoiser_layers) * blk + fusion_flops(m.d_model) + head * head_rows + anchor_head
    raise ValueError(kind)


def trajectory_flops(kind: str, m: config.ModelConfig, V: int, L: int, T: int, K: int) -> float:
    """One reverse trajectory of one sequence (ddpm_cache off; lazy head: each position decoded once)."""
    blk, head = dit_block_flops(m.d_model, L, m.mlp_ratio), lm_head_flops(m.d_model, V + 1)
    if kind == "ar":  # KV cache: one forward over L positions in all
        return L * (m.mdlm_layers * blk + head)
    if kind in ("mdlm", "sedd"):
        return L * (T * m.mdlm_layers * blk + head)
    if kind == "adlm":
        return L * (T * ((m.anchor_layers + m.denoiser_layers) * blk + head + dense_flops(V + 1, m.d_model)) + head)
    refreshes = math.ceil(T / K)
    return L * (T * (m.denoiser_layers * blk + fusion_flops(m.d_model)) + refreshes * m.anchor_layers * blk + head)


def evaluator_flops(tokens: float) -> float:
    g = GPT2_LARGE
    return tokens * (g["layers"] * dit_block_flops(g["d"], 1024) + lm_head_flops(g["d"], g["vocab"]))


TABLE2_ROWS = {"ar": "ar", "sedd": "sedd", "mdlm": "mdlm", "mdlm_fb": "mdlm", "mdlm_dfm": "mdlm", "remdm": "mdlm",
               "adlm": "adlm", "tadm_gamma0": "tadm", "tadm": "tadm"}


def estimates(p: config.Params) -> list[dict]:
    m, V, L = p.model, p.tokenizer.vocab_size, p.packing.seq_len
    rows = []
    tokens = p.train.steps * p.train.global_batch * L
    for run in p.train.models:
        f = 3 * network_forward(run, m, V, L, MASKED) * tokens
        rows.append({"table": "Table 2", "work": f"train {run} ({p.train.steps:,} steps x {p.train.global_batch} x {L})",
                     "kind": "train", "flops": f})
    extra = p.train.replicates - 1  # the training replicates: the same recipe at further seeds
    for run in (p.train.replicate_models if extra > 0 else []):
        f = 3 * network_forward(run, m, V, L, MASKED) * tokens * extra
        rows.append({"table": "Table 2", "work": f"train {run}: {extra} replicates (train.replicates {p.train.replicates})",
                     "kind": "train", "flops": f})
    s = p.sample
    for row, kind in TABLE2_ROWS.items():
        f = sum(trajectory_flops(kind, m, V, L, T, K) for T, K in ((b.T, b.K) for b in s.budgets)) * s.num_samples
        if kind == "ar":
            f = trajectory_flops(kind, m, V, L, 0, 1) * s.num_samples  # sampled once for every budget
        rows.append({"table": "Table 2", "work": f"sample {row} ({s.num_samples} x T {s.steps})", "kind": "sample", "flops": f})
    # each training replicate's draws of the rows the findings compare, at their budgets
    budgets = [(T, s.refresh_every(T)) for T in s.replicate_steps]
    for row in (s.replicate_rows if extra > 0 else []):
        f = sum(trajectory_flops(TABLE2_ROWS[row], m, V, L, T, K) for T, K in budgets) * s.num_samples * extra
        rows.append({"table": "Table 2", "work": f"sample {row}: {extra} replicates x {s.num_samples} x T {s.replicate_steps}",
                     "kind": "sample", "flops": f})
    scored = (len(TABLE2_ROWS) + 1) * len(s.steps) * s.num_samples + p.eval.reference_samples
    scored += (len(s.replicate_rows) * len(s.replicate_steps) * s.num_samples * extra) if extra > 0 else 0
    rows.append({"table": "Table 2", "work": f"score {scored:,} texts (GPT-2 Large, one forward each)", "kind": "score",
                 "flops": evaluator_flops(scored * L)})
    T0 = s.steps[0]
    sweep = sum(trajectory_flops("tadm", m, V, L, T0, K) for K in s.sweep_refresh) + trajectory_flops("tadm", m, V, L, T0, 2)
    rows.append({"table": "Refresh sweep", "work": f"sample TADM K={s.sweep_refresh} + adaptive at T={T0}", "kind": "sample",
                 "flops": sweep * s.num_samples})
    rows.append({"table": "Refresh sweep", "work": "score", "kind": "score",
                 "flops": evaluator_flops((len(s.sweep_refresh) + 1) * s.num_samples * L)})
    pt = p.posttrain
    # one fusion step per example: encoder over the context, ~4 decoder passes over the canvas
    # (self-conditioning, anchor, rollout, teacher) + the student's backward through the denoiser
    per_example = 2 * DG_ACTIVE_PARAMS * (pt.max_context_tokens / 2 + 4 * pt.canvas_length) \
        + 2 * 2 * DG_ACTIVE_PARAMS * pt.denoiser_layers / DG_LAYERS * pt.canvas_length
    global_batch = pt.batch_size * pt.grad_accum * p.runtime.nproc
    rows.append({"table": "Table 1", "work": f"post-train fusion ({pt.steps:,} steps x global batch {global_batch})",
                 "kind": "posttrain", "flops": per_example * pt.steps * global_batch})
    # the fresh-anchor control: the same recipe (its rollouts recompute the anchor: about the same passes)
    rows.append({"table": "Table 1", "work": f"fresh-anchor control ({pt.steps:,} steps x global batch {global_batch})",
                 "kind": "posttrain", "flops": per_example * pt.steps * global_batch})
    fusion_extra = pt.replicates - 1  # the fusion's and the control's replicates (posttrain.replicates)
    if fusion_extra > 0:
        rows.append({"table": "Table 1", "work": f"fusion + control: {fusion_extra} replicates each (posttrain.replicates {pt.replicates})",
                     "kind": "posttrain", "flops": 2 * fusion_extra * per_example * pt.steps * global_batch})
    examples = sum(TABLE1_EXAMPLES[t] for t in pt.tasks if t in TABLE1_EXAMPLES)
    def per_step(K: int) -> float:  # decoder layers per denoising step at K: shared + denoiser, the anchor every K
        return 2 + 8 + 20 * math.ceil(pt.sample_steps / K) / pt.sample_steps

    per_canvas = {None: DG_LAYERS, "control": DG_LAYERS}  # the control refreshes every step (K = 1)
    for K in pt.refresh_every:
        per_canvas[K] = per_step(K)
    layer_share = sum(per_canvas.values()) / DG_LAYERS  # base + control + each K, relative to the base
    gen = 2 * DG_ACTIVE_PARAMS * pt.canvas_length * pt.sample_steps * 2  # ~2 canvases per answer
    rows.append({"table": "Table 1", "work": f"generate {examples:,} examples x {len(pt.seeds)} seeds x (base + control + K={pt.refresh_every})",
                 "kind": "generate", "flops": gen * examples * len(pt.seeds) * layer_share})
    # the fusion replicates at posttrain.replicate_refresh_every (none: the largest K), the control's at K = 1
    if fusion_extra > 0:
        Ks = pt.replicate_refresh_every or [max(pt.refresh_every)]
        share = (sum(per_step(K) for K in Ks) + DG_LAYERS) / DG_LAYERS
        rows.append({"table": "Table 1", "work": f"generate: {fusion_extra} fusion replicates (K={Ks}) + the control's x {len(pt.seeds)} seeds",
                     "kind": "generate", "flops": gen * examples * len(pt.seeds) * share * fusion_extra})
    a = p.asrd
    La = a.prompt_tokens + a.response_tokens
    rows.append({"table": "ASRD", "work": f"train the masked model ({a.train_steps:,} x {a.train_batch} x {La})", "kind": "train",
                 "flops": 3 * network_forward("mdlm", m, V, La, MASKED) * a.train_steps * a.train_batch * La})
    if a.llada_model:  # the LLaDA group: every row (decoders and cache rows) on each task, every seed
        from tadm.experiments.asrd.llada import llada_variants

        for task in a.llada_tasks:
            n = TABLE1_EXAMPLES[task] if not a.llada_eval_examples else min(a.llada_eval_examples, TABLE1_EXAMPLES[task])
            variants = llada_variants(p, task)
            per_answer = 2 * LLADA_PARAMS * (LLADA_PROMPT[task] + a.llada_gen_tokens) * a.llada_steps
            rows.append({"table": "ASRD", "work": f"LLaDA {task}: {n:,} answers x {len(variants)} rows x {len(a.seeds)} seeds x "
                         f"{a.llada_steps} passes (each counted whole: an upper bound, the cache rows compute less)",
                         "kind": "generate", "flops": per_answer * n * len(variants) * len(a.seeds)})
    return rows


def measured_mfu(path: Path) -> float | None:
    if not path.is_file():
        return None
    rows = json.loads(path.read_text())["rows"]
    vals = [float(r["value"].rstrip("%")) / 100 for r in rows if r["check"].endswith("MFU") and re.match(r"^[\d.]+%$", r["value"])]
    return sum(vals) / len(vals) if vals else None


def check(out=print) -> None:
    """FlopCounterMode on a forward of a small MDLM / TADM vs the formula (full head); on the meta
    device, where torch charges attention as well (its CPU kernels are not counted)."""
    import dataclasses

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from tadm.models import build_model

    m = dataclasses.replace(config.ModelConfig(), d_model=64, n_heads=4, mdlm_layers=4, anchor_layers=4, denoiser_layers=2)
    V, L = 500, 64
    for kind in ("mdlm", "tadm"):
        with torch.device("meta"):
            model = build_model(kind, m, V, L)
            z = torch.randint(0, V, (2, L))
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            model(z) if kind == "mdlm" else model(z, z)
        formula = network_forward(kind if kind == "mdlm" else "tadm_gamma0", m, V, L, 1.0) * z.numel()
        out(f"check {kind}: counted {fc.get_total_flops():,} vs formula {formula:,.0f} ({fc.get_total_flops() / formula:.3f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="bf16 dense peak (H100/H200: 989.4)")
    ap.add_argument("--gpu-check", default=str(ROOT / "benchmarks/results/gpu_check.json"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", default=None, help="write gpu_hours.md here")
    args = ap.parse_args(argv)
    p = config.from_dict(config.render_profile(args.profile))
    mfu = dict(MFU)
    measured = measured_mfu(Path(args.gpu_check))
    if measured:
        mfu["train"] = measured
    lines = [f"GPU-hours at the {args.profile} profile, bf16 peak {args.peak_tflops} TFLOP/s; MFU "
             + ", ".join(f"{k} {v:.0%}" for k, v in mfu.items())
             + (" (train measured by gpu_check)" if measured else " (assumed: no GPU has measured them yet)"),
             "", "| table | work | PFLOP | GPU-hours |", "|---|---|---|---|"]
    totals: dict[str, float] = {}
    for r in estimates(p):
        hours = r["flops"] / (mfu[r["kind"]] * args.peak_tflops * 1e12) / 3600
        totals[r["table"]] = totals.get(r["table"], 0.0) + hours
        lines.append(f"| {r['table']} | {r['work']} | {r['flops'] / 1e15:,.0f} | {hours:,.1f} |")
    lines += [f"| **{t}** | total | | **{h:,.0f}** |" for t, h in totals.items()]
    text = "\n".join(lines)
    print(text)
    if args.check:
        check()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_hours.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
