"""Sampling throughput of MDLM, ADLM and TADM (K in 1, 2, 4, 8), side by side in one run.

Random weights are enough for speed. Each round samples once with every method, in turn, so
machine noise hits all of them alike; the reported time is the median over `--repeats`
rounds after `--warmup` rounds. For each method it prints tokens/s (all generated positions,
as the paper counts them), the measured speed-up over ADLM and over MDLM, the FLOP-bound
speed-up (ratio of FLOPs counted during the same real runs) and measured / bound.
`ddpm_cache` is off: every step calls the model, as in the paper's fixed-step budget.

    python benchmarks/sample_throughput.py --arch paper --steps 16 --repeats 2 --out benchmarks/results  # d=768, L=1024, V=50257
    python benchmarks/sample_throughput.py --arch default --steps 64   # the default profile
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
from contextlib import nullcontext
from pathlib import Path

import torch

from tadm import config
from tadm.models import build_model
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

ARCH = {  # (model config overrides, vocab, seq_len)
    "paper": (dict(d_model=768, n_heads=12, mdlm_layers=12, anchor_layers=12, denoiser_layers=6), 50257, 1024),
}


def arch(name: str):
    if name in ARCH:
        overrides, vocab, seq_len = ARCH[name]
        return dataclasses.replace(config.ModelConfig(), **overrides), vocab, seq_len
    p = config.from_dict(config.render_profile(name))
    vocab = p.tokenizer.vocab_size  # 50,257 for gpt2 (validated)
    return p.model, vocab, p.packing.seq_len


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="paper", help="paper, or a profile name (default, micro)")
    ap.add_argument("--steps", type=int, default=16, help="reverse steps T per sample")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--refresh", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    ap.add_argument("--out", default=None, help="write the table (Markdown) and a JSON record here")
    args = ap.parse_args()

    cfg, vocab, seq_len = arch(args.arch)
    device = torch.device(args.device)
    torch.manual_seed(0)
    models = {kind: build_model(kind, cfg, vocab, seq_len).to(device).eval() for kind in ("mdlm", "adlm", "tadm")}
    for m in models.values():  # non-degenerate random weights (the zero init gives uniform outputs)
        for prm in m.parameters():
            torch.nn.init.normal_(prm, std=0.02)
    runs = [("mdlm", None), ("adlm", None)] + [(f"tadm K={k}", k) for k in args.refresh]
    settings = SamplerSettings(sampler="mdlm", steps=args.steps, nucleus_p=0.9, ddpm_cache=False)
    times = {name: [] for name, _ in runs}
    flops = {}
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext()
    for rnd in range(args.warmup + args.repeats):
        for name, k in runs:
            model = models[name.split()[0]]
            with make_adapter(model, FixedInterval(k)) if k else make_adapter(model) as adapter, amp:
                res = sample(adapter, settings, num_samples=args.batch, seq_len=seq_len,
                             generator=torch.Generator(device=device).manual_seed(rnd))
            if device.type == "cuda":
                torch.cuda.synchronize()
            flops[name] = res.counters.flops
            if rnd >= args.warmup:
                times[name].append(res.seconds)

    hw = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    head = (f"arch={args.arch} d={cfg.d_model} layers={cfg.mdlm_layers}/{cfg.anchor_layers}/{cfg.denoiser_layers} "
            f"V={vocab} L={seq_len} T={args.steps} batch={args.batch} {'bf16' if args.bf16 else 'fp32'} on {hw}, "
            f"median of {args.repeats} after {args.warmup} warm-up")
    med = {n: statistics.median(t) for n, t in times.items()}
    lines = [f"<!-- {head} -->", "| method | tokens/s | speed-up vs ADLM | bound vs ADLM | measured/bound | "
             "speed-up vs MDLM | bound vs MDLM | measured/bound |", "|---|---|---|---|---|---|---|---|"]
    record = []
    for name, _ in runs:
        tps = args.batch * seq_len / med[name]
        row = {"method": name, "tokens_per_s": tps}
        cells = [name, f"{tps:,.1f}"]
        for ref in ("adlm", "mdlm"):
            measured, bound = med[ref] / med[name], flops[ref] / flops[name]
            row[f"speedup_vs_{ref}"], row[f"bound_vs_{ref}"] = measured, bound
            cells += [f"{measured:.2f}x", f"{bound:.2f}x", f"{measured / bound:.2f}"]
        record.append(row)
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(head)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"sample_throughput_{args.arch}.md").write_text(table + "\n")
        (out / f"sample_throughput_{args.arch}.json").write_text(json.dumps({"setup": head, "rows": record}, indent=2))


if __name__ == "__main__":
    main()
