"""The evaluator (Table 2's judge) against the models it judges: validation NLL vs steps per config.

Trains one eval.trained candidate on the training split exactly as the `evaluator` stage does
(tadm.metrics.trained_evaluator: same GPT-2, schedule, data order, train_step) and scores it at
the given steps on the AR model's validation tokens and normalisation (trained_evaluator.
validation_nll: first train.eval_sequences sequences of data/packed/validation, summed NLL of
positions 2..L over all sequences x L tokens), so the figures compare directly with
metrics/train/<model>.json val_nelbo. Intermediate evaluations are mid-schedule (the cosine
ends at --set eval.trained.steps); only the last row is a finished run of that length.
Timing is the training loop alone (evaluations excluded), with torch's threads as set.

    OMP_NUM_THREADS=1 python benchmarks/judge.py --label L3_600 --eval-at 300,600
    OMP_NUM_THREADS=1 python benchmarks/judge.py --label L4 --set eval.trained.n_layers=4 \\
        --set eval.trained.steps=1200 --betas 0.9 0.95 --eval-at 600,1200
Each run appends its rows (JSON lines) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import yaml

from tadm import config
from tadm.data.packing import PackedTokens
from tadm.io import read_manifest
from tadm.metrics import trained_evaluator as te
from tadm.train.trainer import GlobalBatches, _seed, adamw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE))
    ap.add_argument("--data", default="data/packed")
    ap.add_argument("--label", required=True)
    ap.add_argument("--set", action="append", default=[], help="dotted.key=yaml_value (repeatable)")
    ap.add_argument("--betas", type=float, nargs=2, default=list(te.BETAS), help="AdamW's (the stage's: te.BETAS)")
    ap.add_argument("--eval-at", default="", help="comma-separated steps to evaluate at (the last step always)")
    ap.add_argument("--out", default="benchmarks/results/judge.jsonl")
    a = ap.parse_args()
    p = config.override(config.load(a.params), {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in a.set)})
    c, data_dir = p.eval.trained, Path(a.data)
    meta = read_manifest(data_dir, "pack", "")["counts"]
    train_data, valid = PackedTokens(data_dir / "train"), PackedTokens(data_dir / "validation")
    torch.manual_seed(_seed(p.seed, 0xE7A1))
    model = te.build(p, meta["vocab_size"], meta["seq_len"], meta["bos_id"], meta["eos_id"])
    opt = adamw(model.parameters(), torch.device("cpu"), lr=c.lr, betas=tuple(a.betas), eps=1e-8, weight_decay=0.0)
    batches = GlobalBatches(len(train_data), c.batch_size, p.seed + 1)
    evals = sorted({int(s) for s in a.eval_at.split(",") if s} | {c.steps})
    params = sum(t.numel() for t in model.parameters())
    seconds, model = 0.0, model.train()
    for step in range(c.steps):
        t0 = time.perf_counter()
        x = torch.stack([torch.from_numpy(train_data[i]) for i in batches.indices(step)])
        loss, _ = te.train_step(model, opt, x, te.learning_rate(step, p))
        seconds += time.perf_counter() - t0
        done = step + 1
        if done in evals:
            nll, tokens, scored = te.validation_nll(model, valid, p.train.eval_sequences, 64, torch.device("cpu"))
            row = {"label": a.label, "set": a.set, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
                   "batch_size": c.batch_size, "lr": c.lr, "betas": a.betas, "steps": c.steps, "at_step": done,
                   "train_tokens": done * c.batch_size * meta["seq_len"], "parameters": params,
                   "val_nll": nll, "val_tokens": tokens, "val_scored_tokens": scored, "train_loss": loss,
                   "train_seconds": seconds, "threads": torch.get_num_threads(),
                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
