"""Wall time of the pipeline's workloads with 1 and with all intra-op threads, side by side.

PyTorch runs each CPU op on `torch.get_num_threads()` threads (2 on this project's machine).
For large matrix products that is nearly 2x; for the many tiny ops of a small model the threads
meet at a barrier after every op, and a busy neighbour on a shared machine stalls the barrier.
Each round times every workload once with 1 thread and once with all, in alternating order, so
machine noise hits both alike; the table gives the median seconds and the median [min-max] of the
per-round ratios (all-thread time / 1-thread time: above 1, one thread is faster).

Workloads (the trained models under --models, as the pipeline's stages run them):
- compute column: a T-step TADM sampling run of the paper-depth stand-in (`compute_column`);
- MDLM train step: one optimiser step of the default profile's MDLM (32 x 64 tokens);
- MDLM sampling: 16 reverse steps of 64 sequences under the sampler's autocast;
- DG base train step: one step of the post-train base's loss (`base_loss`, 32 SFT canvases);
- DG forward: one no-grad forward of the post-train base on 16 canvases (Table 1, ASRD).

Then the train stage's two ways of spending the cores (`runtime.jobs`): two training runs of
--pair-steps steps each (--pair: TADM-dagger and TADM-double-dagger, two of the stage's longest runs,
by default), one after the other with all threads, against side by side with 1/jobs of the threads
each (two processes, `tadm.runtime.run_jobs`); alternated over rounds, start-up included. Two
runs of unequal length gain less: the shorter one's core idles once it ends.

    python benchmarks/threads.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from tadm import config, runtime
from tadm.models import load_pretrained
from tadm.sampling import SamplerSettings, make_adapter, sample

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script from anywhere
from sample_throughput import report  # noqa: E402
from train_throughput import train_step  # noqa: E402


def compute_column_run(steps: int):
    from tadm.sampling.accounting import compute_column

    def run():
        for _ in compute_column([steps], schedule={steps: 4}):
            pass
    return run


def mdlm_train_step(models: Path, p):
    from tadm.methods import get_method

    method = get_method("mdlm", p)
    model = load_pretrained(models / "mdlm").train()
    method.mask_id = model.mask_id  # what build_model sets for a fresh model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, model.vocab_size, (p.train.micro_batch, model.seq_len), generator=torch.Generator().manual_seed(0))

    def run():
        train_step(method, model, opt, x, 1)
    return run


def mdlm_sampling(models: Path, p):
    model = load_pretrained(models / "mdlm").eval()
    settings = SamplerSettings(steps=16, seed=0, autocast=runtime.effective_precision(runtime.CPU, p.runtime.precision))

    def run():
        with make_adapter(model) as adapter:
            sample(adapter, settings, num_samples=p.sample.batch_size, seq_len=model.seq_len)
    return run


def dg_setup(models: Path, p):
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.data.tokenizer import load_tokenizer
    from tadm.posttrain.data import SftCanvases

    tok = load_tokenizer(str(models / "dg_base"))
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(models / "dg_base"))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    data = SftCanvases(Path("data/sft"), "train", p.posttrain.canvas_length, p.posttrain.max_context_tokens, pad)
    return model, data


def dg_train_step(model, data, p):
    from tadm.posttrain.objective import base_loss

    batch = data.batch(list(range(p.posttrain.base.batch_size)))

    def run():
        model.train()
        base_loss(model, batch, torch.Generator().manual_seed(0), p.posttrain.self_cond_p).backward()
        model.zero_grad(set_to_none=True)
    return run


def dg_forward(model, data, p):
    from tadm.posttrain.objective import base_loss

    batch = data.batch(list(range(p.posttrain.eval_batch_size)))

    @torch.no_grad()
    def run():
        model.eval()
        base_loss(model, batch, torch.Generator().manual_seed(0), 0.0)
    return run


def bare_steps(run: str, steps: int, params: str) -> None:
    """`steps` optimiser steps of a fresh `run` model on random tokens (a child of --pair)."""
    from tadm.methods import get_method

    p = config.load(params)
    torch.manual_seed(0)
    method = get_method(run, p)
    model = method.build_model(p.tokenizer.vocab_size, p.packing.seq_len)
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=p.train.lr)
    x = torch.randint(0, p.tokenizer.vocab_size, (p.train.micro_batch, p.packing.seq_len),
                      generator=torch.Generator().manual_seed(0))
    for i in range(steps):
        train_step(method, model, opt, x, i)


def pair_rounds(params: str, steps: int, rounds: int, jobs: int, pair: list[str]) -> list[dict]:
    """Wall seconds of the `pair` of runs one after the other vs side by side, per round."""
    def argv(run):
        return [sys.executable, __file__, "--params", params, "--bare", run, str(steps)]

    out = []
    for rnd in range(rounds):
        times = {}
        for way in (("serial", "side by side") if rnd % 2 == 0 else ("side by side", "serial")):
            t0 = time.perf_counter()
            runtime.run_jobs([(r, argv(r)) for r in pair], jobs if way == "side by side" else 1,
                             log=lambda *_: None)
            times[way] = time.perf_counter() - t0
        out.append(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bare", nargs=2, metavar=("RUN", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--pair", nargs=2, default=["tadm", "tadm_gamma0"])
    ap.add_argument("--pair-steps", type=int, default=100)
    ap.add_argument("--pair-rounds", type=int, default=2)
    ap.add_argument("--params", default=str(config.PARAMS_FILE))
    ap.add_argument("--models", default="models")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--column-steps", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.bare:
        return bare_steps(args.bare[0], int(args.bare[1]), args.params)
    p, models = config.load(args.params), Path(args.models)
    full = torch.get_num_threads()
    dg, canvases = dg_setup(models, p)
    work = {"compute column (T = %d)" % args.column_steps: compute_column_run(args.column_steps),
            "MDLM train step": mdlm_train_step(models, p),
            "MDLM sampling (16 steps)": mdlm_sampling(models, p),
            "DG base train step": dg_train_step(dg, canvases, p),
            "DG forward (no grad)": dg_forward(dg, canvases, p)}
    times = {name: {n: [] for n in (1, full)} for name in work}
    for rnd in range(args.rounds + 1):  # round 0 warms up
        for name, run in work.items():
            for n in ((1, full) if rnd % 2 else (full, 1)):
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                run()
                if rnd:
                    times[name][n].append(time.perf_counter() - t0)
    torch.set_num_threads(full)
    rows, lines = [], ["| workload | 1 thread (s) | %d threads (s) | %d-thread / 1-thread time |" % (full, full),
                       "|---|---|---|---|"]
    for name, t in times.items():
        ratios = [a / b for a, b in zip(t[full], t[1])]
        row = {"workload": name, "one": statistics.median(t[1]), "all": statistics.median(t[full]),
               "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
        rows.append(row)
        lines.append(f"| {name} | {row['one']:.3f} | {row['all']:.3f} | {row['ratio']:.2f} "
                     f"[{row['ratio_min']:.2f}-{row['ratio_max']:.2f}] |")
    jobs = max(2, p.runtime.jobs)
    pairs = pair_rounds(args.params, args.pair_steps, args.pair_rounds, jobs, args.pair)
    ratios = [r["serial"] / r["side by side"] for r in pairs]
    lines += ["", f"| {' + '.join(args.pair)} training, {args.pair_steps} steps each | one after the other, {full} threads (s) | "
              f"side by side, {runtime.job_threads(jobs, full)} thread(s) each (s) | speed-up of side by side |",
              "|---|---|---|---|"]
    lines += [f"| round {i + 1} | {r['serial']:.1f} | {r['side by side']:.1f} | {r['serial'] / r['side by side']:.2f}x |"
              for i, r in enumerate(pairs)]
    rows.append({"workload": "pair", "runs": args.pair, "steps": args.pair_steps, "rounds": pairs,
                 "speedup_median": statistics.median(ratios)})
    head = (f"# {platform.processor() or platform.machine()}, {full} threads available, torch {torch.__version__}; "
            f"median of {args.rounds} rounds, 1 and {full} threads in alternating order")
    report(head, "\n".join(lines), rows, args.out, "threads")


if __name__ == "__main__":
    main()
