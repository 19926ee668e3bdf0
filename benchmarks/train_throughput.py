"""Training throughput (tokens/s) of MDLM, ADLM and TADM at the same width, side by side.

Steps of every method are interleaved round-robin in one process, so machine noise hits all
of them alike; each number is the median over `--repeats` rounds, after `--warmup` rounds.
Ratios are printed relative to MDLM. Random tokens are enough: the cost does not depend on
the data.

    python benchmarks/train_throughput.py                  # the active profile's sizes
    python benchmarks/train_throughput.py --params p.yaml  # any params file
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from tadm import config
from tadm.methods import get_method

RUNS = ("mdlm", "adlm", "tadm", "tadm_gamma0")


def train_step(method, model, opt, x: torch.Tensor, seed: int) -> float:
    """One optimiser step of `method`'s loss on `x` (noise drawn from `seed`); its wall time."""
    t0 = time.perf_counter()
    loss = method.loss(model, x, torch.Generator().manual_seed(seed)).sum() / x.numel()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE))
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: train.micro_batch)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    p = config.load(args.params)
    vocab = p.tokenizer.vocab_size  # 50,257 for gpt2 (validated)
    batch, seq_len = args.batch or p.train.micro_batch, p.packing.seq_len
    torch.manual_seed(0)
    setups = {}
    for run in RUNS:
        method = get_method(run, p)
        model = method.build_model(vocab, seq_len)
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=p.train.lr)
        setups[run] = (method, model, opt)
    x = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    times = {run: [] for run in RUNS}
    for rnd in range(args.warmup + args.repeats):
        for run, (method, model, opt) in setups.items():
            seconds = train_step(method, model, opt, x, rnd)
            if rnd >= args.warmup:
                times[run].append(seconds)
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"# d={p.model.d_model}, layers mdlm/anchor/denoiser = {p.model.mdlm_layers}/{p.model.anchor_layers}/"
          f"{p.model.denoiser_layers}, V={vocab}, L={seq_len}, batch={batch}, median of {args.repeats}")
    base = statistics.median(times["mdlm"])
    print("| run | s/step | tokens/s | speed vs MDLM |\n|---|---|---|---|")
    for run in RUNS:
        med = statistics.median(times[run])
        print(f"| {run} | {med:.3f} | {batch * seq_len / med:,.0f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
