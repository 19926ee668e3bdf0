"""What model.gelu costs: the same models with the tanh-approximated GELU (the released DiT's)
and the exact one, side by side.

For MDLM and TADM at the active profile's sizes, a training step (train.micro_batch sequences)
and a no-grad forward at sampling size (sample.batch_size sequences) are timed with the two
GELUs interleaved round-robin in one process, so machine noise hits both alike; each number is
the median over `--repeats` rounds after `--warmup`. It also prints how far apart the two
functions are. Random tokens are enough: the cost does not depend on the data.

    python benchmarks/gelu_cost.py
    python benchmarks/gelu_cost.py --params p.yaml --repeats 15
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from tadm import config
from tadm.train.methods import get_method

RUNS = ("mdlm", "tadm")
KINDS = ("tanh", "exact")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    p = config.load(args.params)
    vocab, seq_len = p.tokenizer.vocab_size, p.packing.seq_len
    x_train = torch.randint(0, vocab, (p.train.micro_batch, seq_len), generator=torch.Generator().manual_seed(0))
    x_sample = torch.randint(0, vocab + 1, (p.sample.batch_size, seq_len), generator=torch.Generator().manual_seed(1))
    setups = {}
    for run in RUNS:
        for kind in KINDS:
            q = dataclasses.replace(p, model=dataclasses.replace(p.model, gelu=kind))
            method = get_method(run, q)
            torch.manual_seed(0)
            model = method.build_model(vocab, seq_len)
            opt = torch.optim.AdamW([w for w in model.parameters() if w.requires_grad], lr=p.train.lr)
            setups[run, kind] = (method, model, opt)
    train_s = {k: [] for k in setups}
    fwd_s = {k: [] for k in setups}
    for rnd in range(args.warmup + args.repeats):
        for key, (method, model, opt) in setups.items():
            t0 = time.perf_counter()
            loss = method.loss(model, x_train, torch.Generator().manual_seed(rnd)).sum() / x_train.numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t1 = time.perf_counter()
            with torch.no_grad():
                model.hidden(x_sample) if key[0] == "mdlm" else model.hidden(x_sample, x_sample)  # TADM: a fresh anchor
            t2 = time.perf_counter()
            if rnd >= args.warmup:
                train_s[key].append(t1 - t0)
                fwd_s[key].append(t2 - t1)
    grid = torch.linspace(-8, 8, 100_001)
    gap = (F.gelu(grid, approximate="tanh") - F.gelu(grid)).abs().max().item()
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"# d={p.model.d_model}, V={vocab}, L={seq_len}; train batch {p.train.micro_batch}, forward batch "
          f"{p.sample.batch_size}; median of {args.repeats}; max |tanh - exact| on [-8, 8] = {gap:.1e}")
    print("| run | train s/step tanh | exact | speed-up | forward s tanh | exact | speed-up |\n|---|---|---|---|---|---|---|")
    for run in RUNS:
        tt, te = (statistics.median(train_s[run, k]) for k in KINDS)
        ft, fe = (statistics.median(fwd_s[run, k]) for k in KINDS)
        print(f"| {run} | {tt:.4f} | {te:.4f} | {tt / te:.2f}x | {ft:.4f} | {fe:.4f} | {ft / fe:.2f}x |")


if __name__ == "__main__":
    main()
