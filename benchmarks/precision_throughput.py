"""Sampling speed in fp32 against bf16 autocast on this machine, side by side in one run.

`runtime.precision: bf16` runs the samplers' networks under bf16 autocast on a GPU and on a CPU
that multiplies bf16 natively (`tadm.runtime.cpu_has_bf16`). This prints what that buys here:
each round samples with MDLM and TADM (refresh every K) once in fp32 and once in bf16, in turn,
so machine noise hits both alike; tokens/s is the median over the timed rounds and the speed-up
the median [min-max] of the per-round ratios. It also prints how far bf16 moves the network's
prediction: the mean KL(p_fp32 || p_bf16) over masked positions of half-masked canvases.

    python benchmarks/precision_throughput.py                       # the default profile's sizes
    python benchmarks/precision_throughput.py --models models       # the trained models/<run>
    python benchmarks/precision_throughput.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

from tadm import runtime
from tadm.models import build_model, load_pretrained
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script from anywhere
from sample_throughput import arch as arch_of, report  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def load(kind: str, models: str | None, arch: str):
    """models/<kind> when `models` is given, else `kind` at the profile's sizes with random weights."""
    if models:
        return load_pretrained(Path(models) / kind)
    cfg, vocab, seq_len = arch_of(arch)
    model = build_model(kind, cfg, vocab, seq_len)
    for prm in model.parameters():  # non-degenerate random weights (the zero init gives uniform outputs)
        torch.nn.init.normal_(prm, std=0.02)
    return model


@torch.no_grad()
def prediction_kl(model, generator: torch.Generator, batch: int = 16) -> float:
    """Mean KL(p_fp32 || p_bf16) in nats over the masked positions of half-masked random canvases."""
    L, V = model.seq_len, model.vocab_size
    x = torch.randint(0, V, (batch, L), generator=generator)
    masked = torch.rand(batch, L, generator=generator) < 0.5
    z = torch.where(masked, torch.full_like(x, model.mask_id), x)
    logp = {}
    for prec in PRECISIONS:  # TADM with a fresh anchor (z_t' = z_t); MDLM is time-agnostic
        with runtime.autocast(runtime.CPU, prec):
            logits = model(z, z) if model.model_type == "tadm" else model(z)
        logp[prec] = logits[..., :V].double().log_softmax(-1)  # the mask column is never predicted
    kl = (logp["fp32"].exp() * (logp["fp32"] - logp["bf16"])).sum(-1)
    return float(kl[masked].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="default", help="a profile name or an arch of sample_throughput.py")
    ap.add_argument("--models", default=None, help="read trained models/<mdlm|tadm> from this folder")
    ap.add_argument("--steps", type=int, default=64, help="reverse steps T")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--K", type=int, default=8, help="TADM's refresh interval")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the table (Markdown) and a JSON record here")
    args = ap.parse_args()
    if not runtime.cpu_has_bf16():
        raise SystemExit("error: this CPU has no native bf16 (tadm.runtime.cpu_has_bf16): runtime.precision "
                         "bf16 runs fp32 here, so there is nothing to compare")
    torch.manual_seed(0)
    models = {kind: load(kind, args.models, args.arch).eval() for kind in ("mdlm", "tadm")}
    runs = [("mdlm", None), (f"tadm K={args.K}", args.K)]
    times = {(name, prec): [] for name, _ in runs for prec in PRECISIONS}
    for rnd in range(args.warmup + args.repeats):
        for name, k in runs:
            model = models[name.split()[0]]
            for prec in PRECISIONS:
                settings = SamplerSettings(steps=args.steps, seed=rnd, ddpm_cache=False, autocast=prec)
                with make_adapter(model, FixedInterval(k)) if k else make_adapter(model) as adapter:
                    res = sample(adapter, settings, num_samples=args.batch, seq_len=model.seq_len)
                if rnd >= args.warmup:
                    times[(name, prec)].append(res.seconds)
    head = (f"{args.models or 'random weights, arch ' + args.arch}: T={args.steps} batch={args.batch}, "
            f"{platform.machine()} CPU, {torch.get_num_threads()} threads, {args.repeats} timed rounds after "
            f"{args.warmup} warm-up; speed-up: median [min-max] of the per-round fp32 / bf16 time")
    lines = [f"<!-- {head} -->", "| model | tokens/s fp32 | tokens/s bf16 | bf16 speed-up | KL(fp32 ‖ bf16), nats |",
             "|---|---|---|---|---|"]
    record = []
    for name, _ in runs:
        model = models[name.split()[0]]
        L = model.seq_len
        tps = {prec: args.batch * L / statistics.median(times[(name, prec)]) for prec in PRECISIONS}
        ratios = [a / b for a, b in zip(times[(name, "fp32")], times[(name, "bf16")])]
        kl = prediction_kl(model, torch.Generator().manual_seed(0))
        lines.append(f"| {name} | {tps['fp32']:,.0f} | {tps['bf16']:,.0f} | {statistics.median(ratios):.2f}x "
                     f"[{min(ratios):.2f}-{max(ratios):.2f}] | {kl:.2e} |")
        record.append({"model": name, "tokens_per_s": tps, "speedup": ratios, "kl_fp32_bf16": kl,
                       "seconds": {p: times[(name, p)] for p in PRECISIONS}})
    report(head, "\n".join(lines), record, args.out, "precision_throughput")


if __name__ == "__main__":
    main()
