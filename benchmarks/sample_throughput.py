"""Sampling throughput of MDLM, ADLM and TADM (K in 1, 2, 4, 8), side by side in one run.

Random weights are enough for speed. Each round samples once with every method, in turn, so
machine noise hits all of them alike; after `--warmup` rounds, `--repeats` rounds are timed.
For each method it prints tokens/s (all generated positions, as the paper counts them; median
over the rounds), the measured speed-up over ADLM and over MDLM, the FLOP-bound speed-up (ratio
of FLOPs counted during the same real runs) and measured / bound as the median with its spread
(min - max) over the rounds; the speed-up of a round compares the runs of that round only.
`ddpm_cache` is off: every step calls the model, as in the paper's fixed-step budget.
`--ar` adds the AR baseline with and without its KV cache (positions run per layer, tokens/s).

    python benchmarks/sample_throughput.py --arch paper --steps 16 --repeats 5 --out benchmarks/results  # d=768, L=1024, V=50257
    python benchmarks/sample_throughput.py --arch paper-small --steps 16 --repeats 5   # paper depths, d=256, L=256, V=8192
    python benchmarks/sample_throughput.py --arch default --steps 64   # the default profile
    python benchmarks/sample_throughput.py --device cuda --precision bf16 --batch 16   # a GPU, bf16 autocast
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
from pathlib import Path

import torch

from tadm import config, runtime
from tadm.models import build_model
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample, sample_ar

ARCH = {  # (model config overrides, vocab, seq_len)
    "paper": (dict(d_model=768, n_heads=12, mdlm_layers=12, anchor_layers=12, denoiser_layers=6), 50257, 1024),
    # the paper's depths (so the same FLOP bounds up to the head's share) at a width a CPU runs in seconds
    "paper-small": (dict(d_model=256, n_heads=4, mdlm_layers=12, anchor_layers=12, denoiser_layers=6), 8192, 256),
}


def arch(name: str):
    if name in ARCH:
        overrides, vocab, seq_len = ARCH[name]
        return dataclasses.replace(config.ModelConfig(), **overrides), vocab, seq_len
    p = config.from_dict(config.render_profile(name))
    vocab = p.tokenizer.vocab_size  # 50,257 for gpt2 (validated)
    return p.model, vocab, p.packing.seq_len


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="paper", help=f"{', '.join(ARCH)}, or a profile name (default, micro)")
    ap.add_argument("--steps", type=int, default=16, help="reverse steps T per sample")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--refresh", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N (tadm.runtime)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="network autocast (bf16 takes effect on CUDA and on CPUs with native bf16; the draws stay float64)")
    ap.add_argument("--bf16", action="store_true", help="same as --precision bf16")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--ar", action="store_true", help="also time the AR baseline with and without its KV cache")
    ap.add_argument("--out", default=None, help="write the table (Markdown) and a JSON record here")
    args = ap.parse_args()
    precision = "bf16" if args.bf16 else args.precision
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg, vocab, seq_len = arch(args.arch)
    device = runtime.resolve_device(args.device)
    if device != runtime.CPU:
        runtime.configure_backends(True)
    torch.manual_seed(0)
    kinds = ("mdlm", "adlm", "tadm") + (("ar",) if args.ar else ())
    models = {kind: build_model(kind, cfg, vocab, seq_len).to(device).eval() for kind in kinds}
    for m in models.values():  # non-degenerate random weights (the zero init gives uniform outputs)
        for prm in m.parameters():
            torch.nn.init.normal_(prm, std=0.02)
    runs = [("mdlm", None), ("adlm", None)] + [(f"tadm K={k}", k) for k in args.refresh]
    settings = SamplerSettings(sampler="mdlm", steps=args.steps, nucleus_p=0.9, ddpm_cache=False, autocast=precision)
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    flops: dict[str, list[int]] = {name: [] for name, _ in runs}
    ar_runs = [("ar kv-cache", True), ("ar no cache", False)] if args.ar else []
    ar_times: dict[str, list[float]] = {name: [] for name, _ in ar_runs}
    ar_counters: dict[str, dict] = {}
    for rnd in range(args.warmup + args.repeats):
        for name, k in runs:
            model = models[name.split()[0]]
            with make_adapter(model, FixedInterval(k)) if k else make_adapter(model) as adapter:
                res = sample(adapter, settings, num_samples=args.batch, seq_len=seq_len,
                             generator=torch.Generator(device=device).manual_seed(rnd))
            if rnd >= args.warmup:
                times[name].append(res.seconds)
                flops[name].append(res.counters.flops)
        for name, cached in ar_runs:
            res = sample_ar(models["ar"], args.batch, seq_len, bos_id=0, nucleus_p=0.9, seed=rnd, kv_cache=cached,
                            autocast=precision)
            if rnd >= args.warmup:
                ar_times[name].append(res.seconds)
                ar_counters[name] = res.counters.as_dict()

    hw = (torch.cuda.get_device_name(device) if device != runtime.CPU
          else f"{platform.machine()} CPU, {torch.get_num_threads()} threads")
    head = (f"arch={args.arch} d={cfg.d_model} layers={cfg.mdlm_layers}/{cfg.anchor_layers}/{cfg.denoiser_layers} "
            f"V={vocab} L={seq_len} T={args.steps} batch={args.batch} {precision} on {hw}, "
            f"{args.repeats} timed rounds after {args.warmup} warm-up; measured/bound: median [min-max] over rounds")
    lines = [f"<!-- {head} -->", "| method | tokens/s | speed-up vs ADLM | bound vs ADLM | measured/bound | "
             "speed-up vs MDLM | bound vs MDLM | measured/bound |", "|---|---|---|---|---|---|---|---|"]
    record = []
    for name, _ in runs:
        tps = args.batch * seq_len / statistics.median(times[name])
        row: dict = {"method": name, "tokens_per_s": tps, "seconds": times[name]}
        cells = [name, f"{tps:,.1f}"]
        for ref in ("adlm", "mdlm"):
            measured = [a / b for a, b in zip(times[ref], times[name])]
            bound = [a / b for a, b in zip(flops[ref], flops[name])]
            ratio = spread([m / b for m, b in zip(measured, bound)])
            row[f"speedup_vs_{ref}"], row[f"bound_vs_{ref}"] = spread(measured), spread(bound)
            row[f"measured_over_bound_vs_{ref}"] = ratio
            cells += [f"{statistics.median(measured):.2f}x", f"{statistics.median(bound):.2f}x",
                      f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"]
        record.append(row)
        lines.append("| " + " | ".join(cells) + " |")
    if ar_runs:
        lines += ["", "| AR | tokens/s | speed-up vs no cache | layer positions / sequence | FLOPs / token |",
                  "|---|---|---|---|---|"]
        base = statistics.median(ar_times["ar no cache"])
        for name, _ in ar_runs:
            med, c = statistics.median(ar_times[name]), ar_counters[name]
            positions = c["layer_tokens"] / max(c["trajectories"], 1) / args.batch
            lines.append(f"| {name} | {args.batch * seq_len / med:,.1f} | {base / med:.2f}x | {positions:,.0f} | "
                         f"{c['flops_per_token']:,.0f} |")
            record.append({"method": name, "tokens_per_s": args.batch * seq_len / med, "seconds": ar_times[name],
                           "layer_positions_per_sequence": positions, "flops_per_token": c["flops_per_token"]})
    report(head, "\n".join(lines), record, args.out, f"sample_throughput_{args.arch}")


def report(head: str, table: str, record: list[dict], out: str | None, stem: str) -> None:
    """Print a benchmark's setup line and table; with `out`, also write <out>/<stem>.md (the
    table) and <stem>.json (the setup and the rows)."""
    print(head)
    print(table)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.md").write_text(table + "\n")
        (folder / f"{stem}.json").write_text(json.dumps({"setup": head, "rows": record}, indent=2))


if __name__ == "__main__":
    main()
