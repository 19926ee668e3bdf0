"""What the default profile's model choices cost: model.gelu (the released DiT's tanh-approximated
GELU or the exact one) and model.mlp_ratio (the paper's 4 or 2), side by side.

For MDLM and TADM at the active profile's other sizes, a training step (train.micro_batch
sequences) and a no-grad forward at sampling size (sample.batch_size sequences) are timed for
each variant, interleaved round-robin in one process so that machine noise hits all alike; each
number is the median over `--repeats` rounds after `--warmup`, and the speed-up is against the
first variant (the released form). It also prints how far apart the two GELUs are. Random tokens
are enough: the cost does not depend on the data.

    python benchmarks/model_cost.py
    python benchmarks/model_cost.py --params p.yaml --repeats 15
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
from tadm.methods import get_method
from train_throughput import train_step  # benchmarks/ (the script's own directory)

RUNS = ("mdlm", "tadm")
# (label, model overrides); the first is the reference
VARIANTS = (("tanh, mlp 4", {"gelu": "tanh", "mlp_ratio": 4}), ("exact, mlp 4", {"gelu": "exact", "mlp_ratio": 4}),
            ("exact, mlp 2", {"gelu": "exact", "mlp_ratio": 2}))


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
        for kind, overrides in VARIANTS:
            q = dataclasses.replace(p, model=dataclasses.replace(p.model, **overrides))
            method = get_method(run, q)
            torch.manual_seed(0)
            model = method.build_model(vocab, seq_len)
            opt = torch.optim.AdamW([w for w in model.parameters() if w.requires_grad], lr=p.train.lr)
            setups[run, kind] = (method, model, opt)
    train_s = {k: [] for k in setups}
    fwd_s = {k: [] for k in setups}
    for rnd in range(args.warmup + args.repeats):
        for key, (method, model, opt) in setups.items():
            step_s = train_step(method, model, opt, x_train, rnd)
            t1 = time.perf_counter()
            with torch.no_grad():
                model.hidden(x_sample) if key[0] == "mdlm" else model.hidden(x_sample, x_sample)  # TADM: a fresh anchor
            t2 = time.perf_counter()
            if rnd >= args.warmup:
                train_s[key].append(step_s)
                fwd_s[key].append(t2 - t1)
    grid = torch.linspace(-8, 8, 100_001)
    gap = (F.gelu(grid, approximate="tanh") - F.gelu(grid)).abs().max().item()
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"# d={p.model.d_model}, V={vocab}, L={seq_len}; train batch {p.train.micro_batch}, forward batch "
          f"{p.sample.batch_size}; median of {args.repeats}; max |tanh - exact GELU| on [-8, 8] = {gap:.1e}")
    print("| run | variant | train s/step | speed-up | forward s | speed-up |\n|---|---|---|---|---|---|")
    ref = VARIANTS[0][0]
    for run in RUNS:
        t0, f0 = statistics.median(train_s[run, ref]), statistics.median(fwd_s[run, ref])
        for kind, _ in VARIANTS:
            t, f = statistics.median(train_s[run, kind]), statistics.median(fwd_s[run, kind])
            print(f"| {run} | {kind} | {t:.4f} | {t0 / t:.2f}x | {f:.4f} | {f0 / f:.2f}x |")

if __name__ == "__main__":
    main()
