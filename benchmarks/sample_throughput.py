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

`--profile-step I` profiles instead: reverse step I of a trajectory of each method in --profile
(torch.profiler, --repeats times, after the steps before it ran unprofiled), split into the
parts of the step -- the network body, the output head, x_theta (SUBS softmax), the nucleus
draw, the plan (the step's host read), the transition rates, the rest of the loop -- and the
top operators by self CPU time; medians over the repeats. `--profile-label` names the code
version; `--profile-compare A.json B.json --out DIR` writes the two side by side
(DIR/sample_step_profile.md):

    python benchmarks/sample_throughput.py --arch paper --threads 2 --profile-step 9 --profile "tadm K=8" adlm \
        --repeats 3 --profile-label after --out /tmp/prof
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
    ap.add_argument("--profile-step", type=int, default=None, metavar="I",
                    help="profile reverse step I (0-based) instead of timing whole runs (module docstring)")
    ap.add_argument("--profile", nargs="+", default=["tadm K=8"], metavar="METHOD",
                    help='methods to profile: mdlm, adlm, "tadm K=<k>" (default: "tadm K=8")')
    ap.add_argument("--profile-label", default="this code", help="the code version the profile is of")
    ap.add_argument("--profile-compare", nargs=2, default=None, metavar=("BEFORE", "AFTER"),
                    help="write the two profile records (JSON) side by side to --out/sample_step_profile.md")
    args = ap.parse_args()
    if args.profile_compare:
        compare_profiles(*args.profile_compare, args.out)
        return
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
    if args.profile_step is not None:
        hw = f"{platform.machine()} CPU, {torch.get_num_threads()} threads" if device == runtime.CPU else str(device)
        setup = (f"arch={args.arch} d={cfg.d_model} layers={cfg.mdlm_layers}/{cfg.anchor_layers}/"
                 f"{cfg.denoiser_layers} V={vocab} L={seq_len} T={args.steps} batch={args.batch} {precision} on {hw}")
        profile_step(models, args.profile, settings, args.batch, seq_len, args.profile_step, args.repeats,
                     args.profile_label, setup, args.out)
        return
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


PARTS = ("body", "head", "x_theta", "nucleus", "plan", "transition")  # the rest of a step: "loop"


def profile_step(models: dict, methods: list[str], settings: SamplerSettings, batch: int, seq_len: int, step: int,
                 repeats: int, label: str, setup: str, out: str | None) -> None:
    """Profile reverse step `step` of one trajectory per method, `repeats` times (module docstring)."""
    import functools
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    import tadm.sampling.base as base
    from tadm.sampling.adapters import Adapter

    patches = [(Adapter, "features", "body"), (Adapter, "project", "head"), (base, "x_theta_rows", "x_theta"),
               (base, "draw_nucleus", "nucleus"), (base._Network, "plan", "plan")]
    used = type(base.build_sampler(settings, 0))  # the sampler class of the run: its transition starts a step
    patches.append((next(c for c in used.__mro__ if "transition" in vars(c)), "transition", "transition"))
    state: dict = {"step": 0, "prof": None, "clock": []}  # the trajectory's step, the profiler, the step's bounds

    def at_step_start() -> None:  # a step starts with the sampler's transition: profile step `step` only
        if state["step"] == step:
            state["prof"].start()
            state["clock"].append(time.perf_counter())
        elif state["step"] == step + 1:
            state["clock"].append(time.perf_counter())
            state["prof"].stop()
        state["step"] += 1

    saved = []
    for owner, name, part in patches:  # each part of the step under its own profiler label
        original = vars(owner)[name]

        def labelled(*a, _f=original, _part=part, **k):
            if _part == "transition":
                at_step_start()
            with record_function(f"part:{_part}"):
                return _f(*a, **k)

        saved.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(labelled))
    record: dict = {"setup": setup, "label": label, "step": step, "repeats": repeats, "methods": {}}
    try:
        for method in methods:
            kind, _, k = method.partition(" K=")
            rounds = []
            for rnd in range(repeats):
                state.update(step=0, prof=profile(activities=[ProfilerActivity.CPU]), clock=[])
                ctx = make_adapter(models[kind], FixedInterval(int(k))) if k else make_adapter(models[kind])
                with ctx as adapter:
                    sample(adapter, settings, num_samples=batch, seq_len=seq_len,
                           generator=torch.Generator().manual_seed(rnd))
                if len(state["clock"]) == 1:  # the last step: it ended with the run
                    state["clock"].append(time.perf_counter())
                    state["prof"].stop()
                events = state["prof"].key_averages()
                parts = {e.key.removeprefix("part:"): e.cpu_time_total / 1e3 for e in events
                         if e.key.startswith("part:")}
                total = (state["clock"][1] - state["clock"][0]) * 1e3  # the step's wall time (under the profiler)
                ops = sorted(((e.key, e.self_cpu_time_total / 1e3, e.count) for e in events
                              if not e.key.startswith("part:")), key=lambda o: -o[1])[:12]
                rounds.append({"total_ms": total, "parts_ms": parts, "top_ops": ops})
            record["methods"][method] = rounds
            print(profile_table(record, method))
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"sample_step_profile_{label.replace(' ', '_')}.json").write_text(json.dumps(record, indent=2))


def profile_parts(rounds: list[dict]) -> dict[str, float]:
    """Median ms per part over the rounds; "loop" = the step's total less the parts."""
    parts = {p: statistics.median(r["parts_ms"].get(p, 0.0) for r in rounds) for p in PARTS}
    total = statistics.median(r["total_ms"] for r in rounds)
    return {**parts, "loop": max(total - sum(parts.values()), 0.0), "total": total}


def profile_table(record: dict, method: str) -> str:
    rounds = record["methods"][method]
    parts = profile_parts(rounds)
    lines = [f"{method}, step {record['step']} ({record['label']}; median of {len(rounds)}): {parts['total']:.1f} ms",
             "| part | ms | share |", "|---|---|---|"]
    lines += [f"| {p} | {parts[p]:.1f} | {parts[p] / parts['total']:.1%} |" for p in (*PARTS, "loop")]
    return "\n".join(lines)


def compare_profiles(before: str, after: str, out: str | None) -> None:
    """The two profile records side by side (parts, then each version's top operators)."""
    a, b = (json.loads(Path(f).read_text()) for f in (before, after))
    lines = [f"<!-- {a['setup']}; step {a['step']} of each trajectory, torch.profiler, median of "
             f"{a['repeats']} / {b['repeats']} profiled steps (before / after); a part's ms: wall time inside it, "
             "loop: the step's wall time less the parts -->"]
    for method in a["methods"]:
        if method not in b["methods"]:
            continue
        pa, pb = profile_parts(a["methods"][method]), profile_parts(b["methods"][method])
        lines += ["", f"### {method}, reverse step {a['step']}", "",
                  f"| part | {a['label']} ms | share | {b['label']} ms | share | after / before |",
                  "|---|---|---|---|---|---|"]
        for p in (*PARTS, "loop", "total"):
            ratio = f"{pb[p] / pa[p]:.2f}" if pa[p] > 0.05 else "-"
            lines.append(f"| {p} | {pa[p]:.1f} | {pa[p] / pa['total']:.1%} | {pb[p]:.1f} | "
                         f"{pb[p] / pb['total']:.1%} | {ratio} |")
        for rec in (a, b):
            ops: dict[str, list[float]] = {}
            for r in rec["methods"][method]:
                for name, ms, _ in r["top_ops"]:
                    ops.setdefault(name, []).append(ms)
            top = sorted(((statistics.median(v), k) for k, v in ops.items()), reverse=True)[:8]
            lines += ["", f"Top operators, {rec['label']} (self CPU ms, median over the rounds where listed): "
                      + ", ".join(f"{k} {ms:.1f}" for ms, k in top)]
    table = "\n".join(lines)
    print(table)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "sample_step_profile.md").write_text(table + "\n")


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
