"""How much the training loss's time sampler matters: the variance of the per-batch NELBO
estimate under three ways of drawing the B diffusion times of a batch.

- shared shift (this artifact, `tadm.forward_process.sample_times(antithetic=True)`, also the
  form of `tadm.posttrain.objective.antithetic_times`): one u0 ~ U[0, 1) for the batch,
  u_i = (u0 + i / B) mod 1;
- per-stratum jitter (MDLM's release, kuleshov-group/mdlm ``diffusion.py: _sample_t`` with
  ``antithetic_sampling``): u_i = (i + v_i) / B with v_i ~ U[0, 1) independent per stratum;
- iid: u_i ~ U[0, 1) independently (no stratification).

Each then maps to t = eps + (1 - eps) u as the trainer does. The estimate is what one training
step optimises: the batch-mean MDLM NELBO (nats per token) of train.micro_batch validation
sequences (`data/packed/validation`) under the committed default-profile MDLM (`models/mdlm`,
loaded by `tadm.models.load_pretrained`). For each of `--batches` fixed batches it is drawn
`--draws` times per sampler.

A draw: the batch's sequences in a random order, as the shuffled training loader gives them
(with a fixed order the per-stratum sampler would give each sequence nearly the same time on
every draw and hide the variance of which sequence meets which stratum), stratum j going to
row j. Under that random order both stratified samplers are, in law, exactly what they are in
training (the shared shift only rotates which row meets which stratum). The samplers share
random numbers where their laws allow it, so that their difference is measured, not their
noise: one row order and one set of per-token mask uniforms for all three; the shared shift's
offset (u0 = w_0 / B) is the per-stratum sampler's offset in stratum 0 (w_0), so the rare
heavy draws -- a masked token at a t near eps, weighted by 1/t -- hit both alike; iid draws its
own times. Reported: the variance over draws within a batch (averaged over batches; what the
sampler can change), the pooled variance over batches and draws (a batch drawn at random from
the fixed ones as well), and ratios with a hierarchical bootstrap (batches, then draws within a
batch, paired across samplers) standard error and 95 % interval. The per-stratum sampler lives
here only; the artifact's training draws are unchanged.

    OMP_NUM_THREADS=1 python benchmarks/antithetic_variance.py            # ~3 minutes, 1 thread
    python benchmarks/antithetic_variance.py --batches 4 --draws 16     # a quick look
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from tadm import config
from tadm.data.packing import PackedTokens
from tadm.forward_process import sample_times
from tadm.losses import nelbo_from_rows, subs_readout
from tadm.models import load_pretrained
from tadm.schedule import LogLinearSchedule
from tadm.methods import EPS, get_method

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "antithetic_variance"


def _to_times(u: torch.Tensor, eps: float) -> torch.Tensor:
    """u in [0, 1) onto [eps, 1), kept below 1 (`sample_times`' last two lines)."""
    t = eps + (1.0 - eps) * u
    below_one = torch.nextafter(torch.ones((), dtype=u.dtype), torch.zeros((), dtype=u.dtype))
    return t.clamp(max=below_one.item())


def shared_shift_times(u0: torch.Tensor, batch: int, eps: float) -> torch.Tensor:
    """This artifact's sampler given its one uniform u0 (1,): `sample_times(antithetic=True)`'s
    arithmetic (checked bit for bit by `check_samplers`)."""
    grid = torch.arange(batch, dtype=u0.dtype) / batch
    return _to_times(torch.remainder(u0 + grid, 1.0), eps)


def per_stratum_times(v: torch.Tensor, eps: float) -> torch.Tensor:
    """MDLM's released antithetic sampler given its B uniforms v: (v / B + i / B) mod 1, one
    time in each stratum [i/B, (i+1)/B), each jittered independently. Not used by any training
    run of this artifact (see docs/deviations.md)."""
    n = v.shape[0]
    return _to_times(torch.remainder(v / n + torch.arange(n, dtype=v.dtype) / n, 1.0), eps)


def iid_times(u: torch.Tensor, eps: float) -> torch.Tensor:
    """Independent times given B uniforms: `sample_times(antithetic=False)`'s arithmetic."""
    return _to_times(u, eps)


def draw_times(batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One draw of each sampler's times (B,), row j in stratum j for the stratified two; the
    shared shift's offset is the per-stratum draw's offset in stratum 0."""
    w = torch.rand(batch, generator=gen)
    return {"shared": shared_shift_times(w[:1] / batch, batch, EPS), "stratum": per_stratum_times(w, EPS),
            "iid": iid_times(torch.rand(batch, generator=gen), EPS)}


def check_samplers(batch: int) -> None:
    """The samplers here are the artifact's `sample_times` draws given the same uniforms, bit for
    bit, and the shared shift with u0 = w_0 / B sits in the per-stratum draw's strata."""
    for seed in range(5):
        for antithetic, mine in ((True, lambda g: shared_shift_times(torch.rand(1, generator=g), batch, EPS)),
                                 (False, lambda g: iid_times(torch.rand(batch, generator=g), EPS))):
            ref = sample_times(batch, EPS, antithetic, torch.Generator().manual_seed(seed))
            if not torch.equal(mine(torch.Generator().manual_seed(seed)), ref):
                raise SystemExit(f"the benchmark's copy of sample_times(antithetic={antithetic}) is stale")
        t = draw_times(batch, torch.Generator().manual_seed(seed))
        for name in ("shared", "stratum"):
            stratum = torch.floor((t[name] - EPS) / (1 - EPS) * batch + 1e-4).long()  # 1e-4: rounding at a boundary
            if not torch.equal(stratum, torch.arange(batch)):
                raise SystemExit(f"draw_times: the {name} sampler does not put row j in stratum j")


SAMPLERS = {"shared": "shared shift (this artifact)", "stratum": "per-stratum jitter (MDLM release)", "iid": "iid"}


@torch.no_grad()
def batch_loss(model, x: torch.Tensor, t: torch.Tensor, u: torch.Tensor, schedule, mask_id: int) -> float:
    """The trainer's per-step loss (sum of per-sequence NELBOs / tokens) at times t (B,), a
    token masked where its uniform u (B, L) is at least alpha_t (`mask_tokens`' rule)."""
    z_t = torch.where(u < schedule.alpha(t)[:, None], x, torch.full_like(x, mask_id))
    ce = model(z_t, readout=subs_readout(z_t, x, mask_id))
    return float(nelbo_from_rows(ce, t, schedule).double().sum() / x.numel())


def check_trainer_path(model, method, x: torch.Tensor, schedule, mask_id: int) -> None:
    """`batch_loss` with the shared-shift times and the trainer's draw order is the trainer's
    `MDLMMethod.nelbo` exactly: the benchmark measures the loss that is trained."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        ref = float(method.nelbo(model, x, g).double().sum() / x.numel())
    g = torch.Generator().manual_seed(1234)
    t = sample_times(len(x), EPS, True, g)
    u = torch.rand(x.shape, generator=g)
    mine = batch_loss(model, x, t, u, schedule, mask_id)
    if mine != ref:
        raise SystemExit(f"benchmark loss {mine!r} differs from MDLMMethod.nelbo {ref!r}: the benchmark is stale")


def bootstrap(losses: dict[str, np.ndarray], reps: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Each sampler's within-batch variance (mean over batches of the variance over draws) and
    pooled variance, `reps` times over batches resampled with replacement and draws resampled
    within each (the same resample for every sampler: paired)."""
    rng = np.random.default_rng(seed)
    k, r = next(iter(losses.values())).shape
    out = {kind: {name: np.empty(reps) for name in losses} for kind in ("within", "pooled")}
    for i in range(reps):
        rows = rng.integers(0, k, k)
        cols = rng.integers(0, r, (k, r))
        for name, a in losses.items():
            sample = a[rows[:, None], cols]
            out["within"][name][i] = sample.var(axis=1, ddof=1).mean()
            out["pooled"][name][i] = sample.ravel().var(ddof=1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE))
    ap.add_argument("--batches", type=int, default=12, help="fixed validation batches")
    ap.add_argument("--draws", type=int, default=40, help="draws of times (and masks) per batch and sampler")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT), help="writes <out>.md and <out>.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = config.load(args.params)
    micro = p.train.micro_batch
    model = load_pretrained(ROOT / "models" / "mdlm")
    method = get_method("mdlm", p)
    method.mask_id = mask_id = model.mask_id
    schedule = LogLinearSchedule(EPS)
    data = PackedTokens(ROOT / "data" / "packed" / "validation")
    if args.batches * micro > len(data):
        raise SystemExit(f"--batches {args.batches} x train.micro_batch {micro} exceeds the "
                         f"{len(data)} validation sequences")
    order = np.random.default_rng(args.seed).permutation(len(data))[: args.batches * micro]
    rows = [torch.from_numpy(np.asarray(data[int(i)], dtype=np.int64)) for i in order]
    batches = [torch.stack(rows[b * micro:(b + 1) * micro]) for b in range(args.batches)]
    check_trainer_path(model, method, batches[0], schedule, mask_id)
    check_samplers(micro)
    losses = {name: np.empty((args.batches, args.draws)) for name in SAMPLERS}
    start = time.perf_counter()
    for b, x in enumerate(batches):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + b)
        for r in range(args.draws):
            xs = x[torch.randperm(micro, generator=gen)]  # the loader's random row order
            u = torch.rand(x.shape, generator=gen)  # the masks' uniforms
            for name, t in draw_times(micro, gen).items():
                losses[name][b, r] = batch_loss(model, xs, t, u, schedule, mask_id)
        print(f"batch {b + 1}/{args.batches}: {time.perf_counter() - start:.0f} s", flush=True)
    seconds = time.perf_counter() - start

    within = {name: float(a.var(axis=1, ddof=1).mean()) for name, a in losses.items()}
    pooled = {name: float(a.ravel().var(ddof=1)) for name, a in losses.items()}
    means = {name: float(a.mean()) for name, a in losses.items()}
    boot = bootstrap(losses, args.bootstrap, args.seed + 1)
    point = {"within": within, "pooled": pooled}
    ratios = {kind: {} for kind in point}
    for kind in point:
        for a, b in (("shared", "stratum"), ("shared", "iid"), ("stratum", "iid")):
            dist = boot[kind][a] / boot[kind][b]
            lo, hi = np.percentile(dist, [2.5, 97.5])
            ratios[kind][f"{a}/{b}"] = {"ratio": point[kind][a] / point[kind][b], "se": float(dist.std(ddof=1)),
                                        "ci95": [float(lo), float(hi)]}
    result = {
        "model": "models/mdlm", "data": "data/packed/validation", "micro_batch": micro, "seq_len": int(batches[0].shape[1]),
        "batches": args.batches, "draws": args.draws, "bootstrap": args.bootstrap, "seed": args.seed,
        "samplers": SAMPLERS,
        "mean_loss": means, "within_batch_variance": within, "pooled_variance": pooled,
        "within_batch_variance_se": {name: float(v.std(ddof=1)) for name, v in boot["within"].items()},
        "pooled_variance_se": {name: float(v.std(ddof=1)) for name, v in boot["pooled"].items()},
        "ratios": ratios, "seconds": round(seconds, 1), "threads": args.threads,
        "torch": torch.__version__, "machine": platform.machine(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# Antithetic time sampling: variance of the per-batch loss",
        "",
        f"`python benchmarks/antithetic_variance.py --batches {args.batches} --draws {args.draws}` "
        f"({seconds:.0f} s, {args.threads} thread(s), torch {torch.__version__}). The batch-mean MDLM NELBO "
        f"(nats/token) of {micro} validation sequences (train.micro_batch) under `models/mdlm`, drawn {args.draws} "
        f"times per sampler on each of {args.batches} fixed batches (random {micro}-sequence subsets of the split), "
        "each draw in a random row order as the shuffled loader gives; the samplers share the row order, the "
        "masks' per-token uniforms and (the two stratified ones) the offset in the lowest stratum, so that their "
        "difference is measured rather than their noise; iid draws its own times. Within: mean over batches of the "
        "variance over draws (what the sampler can change). Pooled: variance over all batches and draws (the batch "
        f"random as well). ± is a hierarchical bootstrap se ({args.bootstrap} resamples of batches, then draws, "
        "paired across samplers).",
        "",
        "| sampler | mean loss | within-batch variance | pooled variance |",
        "|---|---|---|---|",
    ]
    for name, label in SAMPLERS.items():
        md.append(f"| {label} | {means[name]:.4f} | {within[name]:.3e} ± {result['within_batch_variance_se'][name]:.1e} "
                  f"| {pooled[name]:.3e} ± {result['pooled_variance_se'][name]:.1e} |")
    md += ["", "| ratio of variances | within-batch | 95 % interval | pooled | 95 % interval |", "|---|---|---|---|---|"]
    for key in ratios["within"]:
        a, b = key.split("/")
        w, q = ratios["within"][key], ratios["pooled"][key]
        md.append(f"| {SAMPLERS[a]} / {SAMPLERS[b]} | {w['ratio']:.3f} ± {w['se']:.3f} "
                  f"| [{w['ci95'][0]:.3f}, {w['ci95'][1]:.3f}] | {q['ratio']:.3f} ± {q['se']:.3f} "
                  f"| [{q['ci95'][0]:.3f}, {q['ci95'][1]:.3f}] |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
