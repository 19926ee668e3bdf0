"""GPU check: does the paper profile's code train, resume, sample, score and post-train on this
machine's accelerator, and how fast? One command, one table (benchmarks/gpu_check runs it).

    (a) paper-arch MDLM and TADM training in bf16 through the real trainer, runtime.compile off
        and on (each transformer block compiled: tadm.train.trainer.compile_blocks): tokens/s
        and model FLOPs utilisation (a step's model FLOPs from tadm.compute: 3 x the forward,
        LM heads on the masked rows, no recomputed head chunk); then one TADM step with the
        heads' chunks checkpointed against kept (Method.checkpoint_heads), side by side in
        alternating rounds: the step-time ratio and each one's peak memory
    (b) kill (SIGKILL) and resume of a training run on the device: weights after resume vs an
        uninterrupted run (and run-to-run, to separate resume bugs from kernel nondeterminism);
        a 40-step run, killed once its step-4 checkpoint exists
    (c) sampling at the paper architecture, T = 2048, K = 1, 2, 4, 8, ddpm_cache off, Linear
        weights cast to bf16 once (tadm.runtime.cast_for_autocast, as the sample stage does):
        tokens/s and measured / FLOP-bound speed-up vs MDLM and vs ADLM -- batch 1 first (the
        whole trajectory), then batch 1 with CUDA graphs (runtime.cuda_graphs) beside it, then
        the largest batch that fits (doubled from 1 on the first `--probe-steps` steps of a T = 2048
        trajectory up to `--max-batch`, by default twice the memory estimate `batch_cap`; any
        out-of-memory RuntimeError ends the probe, never the section; a failure at batch 1 is
        reported as batch 0 and the timing skipped), timed on
        the first `--big-steps` steps of a T = 2048 trajectory (tokens/s normalised to T)
    (d) one scoring batch (Gen PPL + MAUVE features from one forward) with a GPT-2-Large-shaped
        random evaluator in bf16
    (e) one TADM:Post-train step (fusion training on rollouts, CE + KD) and one `generate` of a
        small random DiffusionGemma with anchor reuse

Before any section runs, a pre-flight (`preflight`) checks what the chosen sections need --
a C compiler, and on CUDA Triton and the Python headers, for Inductor; transformers >= 5.24
for section e's DiffusionGemma; compute capability >= 8.0 and free device memory -- and stops
with exit 2 and one line naming what is missing.

Random weights everywhere: speed does not depend on them, and nothing is downloaded.
`--smoke` runs every section at micro sizes on whatever device there is (the test suite runs
it on the CPU so that this script cannot rot between GPU sessions; there the compiled training
rows use torch.compile's aot_eager backend: no C++ code generation).

    python benchmarks/gpu_check.py --out benchmarks/results          # on a GPU machine
    python benchmarks/gpu_check.py --smoke                             # anywhere, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import signal
import subprocess
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tadm import compat, config, cuda_graphs, runtime  # noqa: E402

# dense bf16 tensor-core peaks (TFLOP/s, no sparsity) for the MFU column
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.2}
PAPER_TADM_TOK_S = 37.42  # the paper's TADM sampling throughput (Table 2, T = 2048)


class Table:
    """Rows of (section, check, value, note); printed as Markdown."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, section: str, check: str, value, note: str = "") -> None:
        if isinstance(value, float):
            value = f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
        self.rows.append({"section": section, "check": check, "value": str(value), "note": note})
        print(f"[{section}] {check}: {value} {note}", flush=True)

    def markdown(self, head: str) -> str:
        lines = [f"<!-- {head} -->", "| section | check | value | note |", "|---|---|---|---|"]
        lines += [f"| {r['section']} | {r['check']} | {r['value']} | {r['note']} |" for r in self.rows]
        return "\n".join(lines)


def paper_params(smoke: bool, **changes) -> config.Params:
    """The paper profile (micro sizes with --smoke), with dotted-key changes."""
    p = config.from_dict(config.render_profile("micro" if smoke else "paper"))
    return config.override(p, changes)


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def write_packed(root: Path, vocab: int, seq_len: int, n_train: int, n_valid: int) -> Path:
    """Random token shards in the pack stage's layout (shards + manifest.json)."""
    from tadm.data.packing import write_random

    return write_random(root / "packed", vocab, seq_len, {"train": n_train, "validation": n_valid})


# ----------------------------------------------------------------------------- (a) training


def check_training(t: Table, args, device: torch.device, work: Path) -> None:
    """MDLM and TADM trained with runtime.compile off, then on (the paper profile's setting).
    MFU = tokens/s x model FLOPs per token (tadm.compute) / peak; the compiled row's check ends
    in "MFU" (benchmarks/gpu_hours.py averages those), the other's in "MFU, compile off"."""
    from tadm.compute import train_step_flops_per_token
    from tadm.train import trainer

    trainer.COMPILE_BACKEND = args.compile_backend
    peak = peak_flops(device, args.peak_tflops)
    data = None
    for compiled in (False, True):
        p = paper_params(args.smoke, **{"train.steps": args.train_steps, "train.global_batch": args.train_batch,
                                        "train.log_every": max(1, args.train_steps // 3), "train.eval_every": 10**6,
                                        "train.eval_sequences": 2, "train.checkpoint_every": 10**6,
                                        "train.warmup_steps": 1, "runtime.compile": compiled})
        vocab, L = p.tokenizer.vocab_size, p.packing.seq_len
        if data is None:
            data = write_packed(work, vocab, L, n_train=max(64, 2 * p.train.global_batch), n_valid=4)
        tag = f"compile on, {args.compile_backend}" if compiled else "compile off"
        for name in ("mdlm", "tadm"):
            per_token = train_step_flops_per_token(name, p.model, vocab, L)
            summary = trainer.train(name, p, data_dir=data, root=work / ("compiled" if compiled else "eager"),
                                    log=lambda *_: None)
            tps = summary["train_tokens_per_s"]
            t.add("a train", f"{name} tokens/s (bf16, micro {p.train.micro_batch} x L {L}, {tag})", float(tps),
                  f"{per_token / 1e9:.3g} GFLOP/token (model FLOPs of a step, tadm.compute)")
            if peak:
                t.add("a train", f"{name} MFU" if compiled else f"{name} MFU, compile off",
                      f"{100 * tps * per_token / peak:.1f}%", "target >= 40%")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    check_head_readout(t, args, device)


HEAD_ROUNDS = 6  # alternating rounds of the readout comparison (one step of each variant per round)


def check_head_readout(t: Table, args, device: torch.device) -> None:
    """One TADM training step (forward + backward, bf16 autocast, the profile's micro-batch) with
    the heads' chunks checkpointed against kept (`Method.checkpoint_heads`, what the trainer
    chooses from the memory estimate), timed side by side in alternating rounds: the median
    step time of each, their ratio, and each one's peak device memory. Checkpointing is forced at
    any size here (tadm.losses.CHECKPOINT_MIN_ELEMENTS = 0), so --smoke exercises both paths."""
    from tadm import losses
    from tadm.methods import get_method

    p = paper_params(args.smoke)
    vocab, L, b = p.tokenizer.vocab_size, p.packing.seq_len, p.train.micro_batch
    method = get_method("tadm", p)
    torch.manual_seed(0)
    with torch.device(device):
        model = method.build_model(vocab, L)
    x = torch.randint(vocab, (b, L), device=device)
    autocast = runtime.autocast(device, p.train.precision)
    saved_min, losses.CHECKPOINT_MIN_ELEMENTS = losses.CHECKPOINT_MIN_ELEMENTS, 0
    times, peaks = {True: [], False: []}, {}
    try:
        for r in range(HEAD_ROUNDS + 1):  # round 0 warms up and is not timed
            for keep in ((True, False) if r % 2 else (False, True)):
                method.checkpoint_heads = not keep
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                runtime.synchronize(device)
                t0 = time.perf_counter()
                with autocast:
                    loss = method.loss(model, x, torch.Generator(device).manual_seed(r)).float().sum()
                loss.backward()
                runtime.synchronize(device)
                if r:
                    times[keep].append(time.perf_counter() - t0)
                if device.type == "cuda":
                    peaks[keep] = torch.cuda.max_memory_allocated(device)
                model.zero_grad(set_to_none=True)
    finally:
        losses.CHECKPOINT_MIN_ELEMENTS = saved_min
    kept, ckpt = (statistics.median(times[k]) for k in (True, False))
    where = f"tadm, micro {b} x L {L}, {HEAD_ROUNDS} alternating rounds"
    t.add("a train", "head readout: checkpointed / kept step time", f"{ckpt / kept:.3f}",
          f"{where}; median step {1e3 * kept:.1f} ms kept, {1e3 * ckpt:.1f} ms checkpointed")
    if peaks:
        t.add("a train", "head readout: peak memory kept / checkpointed",
              f"{peaks[True] / peaks[False]:.3f}", f"{peaks[True] / 2**30:.2f} GiB kept, {peaks[False] / 2**30:.2f} GiB checkpointed")


# ----------------------------------------------------------------------------- (b) kill and resume

RESUME_STEPS = 40  # long enough to be killed mid-run (8 steps could end inside one 50 ms poll)
KILL_AT = 4  # SIGKILL once this step's checkpoint exists


def subprocess_env() -> dict:
    """This process's environment for a child `python -m tadm`: the repository prepended to
    PYTHONPATH (what was there stays: the wrapper's /tmp/tadm-site, an offline image's wheels)."""
    rest = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + ([rest] if rest else [])),
                CUBLAS_WORKSPACE_CONFIG=":4096:8")


def _run_train(params_file: Path, data: Path, root: Path, kill_after: Path | None = None) -> bool:
    """Train mdlm in a child process; with `kill_after`, SIGKILL it once that path exists.
    Returns whether it was killed."""
    cmd = [sys.executable, "-m", "tadm", "--params", str(params_file), "train", "mdlm", "--data", str(data)]
    proc = subprocess.Popen(cmd, cwd=root, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    if kill_after is not None:
        deadline = time.time() + 300
        while not kill_after.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"train exited {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    return False


def check_resume(t: Table, args, device: torch.device, work: Path) -> None:
    import yaml
    from safetensors.torch import load_file

    p = paper_params(True, **{"train.steps": RESUME_STEPS, "train.checkpoint_every": 2, "train.eval_every": 20,
                              "train.log_every": 2, "runtime.device": str(device) if device.type == "cuda" else "cpu",
                              "runtime.nproc": 1, "model.d_model": 128 if not args.smoke else 32,
                              "model.n_heads": 4 if not args.smoke else 2})
    params_file = work / "resume_params.yaml"
    params_file.write_text(yaml.safe_dump(config.to_dict(p), sort_keys=False))
    data = write_packed(work / "resume", p.tokenizer.vocab_size, p.packing.seq_len, n_train=64, n_valid=4)
    weights = []
    for run in ("a", "b", "killed"):
        root = work / f"resume_{run}"
        root.mkdir()
        if run == "killed":
            ckpts = root / "checkpoints" / "mdlm"
            killed = _run_train(params_file, data, root, kill_after=ckpts / f"step_{KILL_AT:06d}")
            left = sorted(c.name for c in ckpts.glob("step_*")) if ckpts.is_dir() else []
            if not killed or (root / "models" / "mdlm").exists():
                t.add("b resume", "kill", f"run of {RESUME_STEPS} steps finished before the kill", "inconclusive")
            else:
                t.add("b resume", "kill", f"SIGKILL during a {RESUME_STEPS}-step run", f"checkpoints left: {left}")
        _run_train(params_file, data, root)
        weights.append(load_file(str(root / "models" / "mdlm" / "model.safetensors")))

    def max_diff(u, v):
        return max(float((u[k].float() - v[k].float()).abs().max()) for k in u)

    run_to_run, resumed = max_diff(weights[0], weights[1]), max_diff(weights[0], weights[2])
    t.add("b resume", "max |w_resumed - w_uninterrupted|", resumed, "identical" if resumed == 0 else "differs")
    t.add("b resume", "max |w_run1 - w_run2| (no kill)", run_to_run,
          "deterministic kernels" if run_to_run == 0 else "kernel nondeterminism bound")


# ----------------------------------------------------------------------------- (c) sampling


class _Stop(Exception):
    """Raised by the network call after the last step to time: ends a trajectory early."""


def _paper_models(p: config.Params, device: torch.device, precision: str):
    """MDLM, ADLM and TADM at the profile's size with random weights, on `device`, their Linear
    weights cast once to the sampling precision (runtime.cast_for_autocast: the sample stage's)."""
    from tadm.models import build_model

    torch.manual_seed(0)
    out = {}
    for kind in ("mdlm", "adlm", "tadm"):
        m = build_model(kind, p.model, p.tokenizer.vocab_size, p.packing.seq_len)
        for prm in m.parameters():  # non-degenerate random weights (the zero init is uniform)
            torch.nn.init.normal_(prm, std=0.02)
        out[kind] = runtime.cast_for_autocast(m.to(device=device).eval(), device, precision)
    return out


def _sample_once(models, name: str, k: int | None, steps: int, batch: int, L: int, device, precision: str,
                 stop_after: int | None = None) -> tuple[float, int, int]:
    """(seconds, forward FLOPs, steps run) of one trajectory of T = `steps` at `batch`, ddpm_cache
    off (a network call every step); with `stop_after`, of its first `stop_after` steps only."""
    from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample

    settings = SamplerSettings(sampler="mdlm", steps=steps, nucleus_p=0.9, ddpm_cache=False, autocast=precision)
    adapter = make_adapter(models[name], FixedInterval(k)) if k else make_adapter(models[name])
    calls, features = [0], adapter.features

    def counted(z, step, t):
        if stop_after is not None and calls[0] >= stop_after:
            raise _Stop
        calls[0] += 1
        return features(z, step, t)

    adapter.features = counted
    with adapter:
        runtime.synchronize(device)
        t0 = time.perf_counter()
        try:
            sample(adapter, settings, num_samples=batch, seq_len=L, generator=torch.Generator(device=device).manual_seed(0))
        except _Stop:
            pass
        runtime.synchronize(device)
        secs = time.perf_counter() - t0
    return secs, adapter.counter.flops, calls[0]


def sampling_bytes_per_sequence(p: config.Params, precision: str) -> int:
    """Memory one sequence of a sampling batch holds at the peak of an ADLM step, the heaviest row
    (an estimate, in the terms of tadm.memory_estimate): the anchor head's logits over the whole
    canvas, L x (V + 1), with their softmax and the fp32 copy the sampler reads (LOGIT_COPIES), and
    one block's activations, L x (4 + 2 mlp_ratio) d; nothing is kept for a backward pass."""
    from tadm import memory_estimate as mem

    a = 2 if precision == "bf16" else 4
    L, d, V = p.packing.seq_len, p.model.d_model, p.tokenizer.vocab_size
    return L * (mem.LOGIT_COPIES * 4 * (V + 1) + a * (4 + 2 * p.model.mlp_ratio) * d)


def batch_cap(p: config.Params, precision: str, total_bytes: int, weights_bytes: int = 0) -> tuple[int, int]:
    """(the probe's cap, the estimate): the estimate is the batch whose sequences fill the device's
    memory less the weights (`sampling_bytes_per_sequence`); the cap is the power of two at or
    above twice it, so the doubling probe ends on a real failure, not on a guess."""
    estimate = max(1, (total_bytes - weights_bytes) // sampling_bytes_per_sequence(p, precision))
    return 1 << max(0, math.ceil(math.log2(2 * estimate))), int(estimate)


def _largest_batch(models, L: int, T: int, device, precision: str, cap: int, probe_steps: int,
                   estimate: int | None = None) -> tuple[int, str]:
    """Double the batch until the first `probe_steps` steps of a T-step trajectory of the
    heaviest methods (ADLM, TADM K=1) fail: any RuntimeError ends the probe (torch's
    OutOfMemoryError and the allocation failures cuBLAS / cuDNN raise as plain RuntimeError),
    never the section. Returns (the largest batch that ran, 0 when batch 1 failed; a note)."""
    if device.type != "cuda":
        return min(cap, 4), f"not probed on {device.type}"
    guess = f" (memory estimate: {estimate})" if estimate else ""
    best, b, note = 0, 1, ""
    while b <= cap:
        failed = None
        torch.cuda.reset_peak_memory_stats(device)
        try:
            for name, k in (("adlm", None), ("tadm", 1)):
                _sample_once(models, name, k, T, b, L, device, precision, stop_after=probe_steps)
        except RuntimeError as e:
            failed = f"batch {b}: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
        torch.cuda.empty_cache()
        if failed:
            note = (f"{failed}: nothing runs" if best == 0 else failed) + guess
            break
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        best, b = b, b * 2
        note = f"peak {peak:.1f} GiB at batch {best}; no failure up to the cap {cap}{guess}"
    return best, note


def check_sampling(t: Table, args, device: torch.device) -> None:
    from tadm.experiments.sampling import graphed_pieces

    p = paper_params(args.smoke)
    L, T = p.packing.seq_len, args.sample_steps
    precision = "bf16" if device.type == "cuda" else "fp32"
    models = _paper_models(p, device, precision)
    runs = [("mdlm", None), ("adlm", None)] + [("tadm", k) for k in (1, 2, 4, 8)]

    def label_of(name, k):
        return name if k is None else f"tadm K={k}"

    def timed(batch: int, stop: int | None):
        """Every run at `batch`: a warm-up (the first steps of the same trajectory: kernels,
        allocator, CUDA-graph captures), then the timed trajectory (its first `stop` steps)."""
        secs, flops, steps = {}, {}, {}
        for name, k in runs:
            _sample_once(models, name, k, T, batch, L, device, precision, stop_after=min(8, T))
        for name, k in runs:
            label = label_of(name, k)
            secs[label], flops[label], steps[label] = _sample_once(models, name, k, T, batch, L, device, precision,
                                                                   stop_after=stop)
        return secs, flops, steps

    def report(batch: int, secs, flops, steps, suffix: str = "", versus=None, extra: str = "") -> None:
        for label in secs:
            per_step = secs[label] / steps[label]
            tps = batch * L / (per_step * T)  # tokens/s at the full budget T
            cells = [f"{tps:,.1f} tok/s"]
            for ref in ("mdlm", "adlm"):
                measured, bound = secs[ref] / secs[label], flops[ref] / flops[label]
                cells.append(f"vs {ref.upper()} {measured:.2f}x / bound {bound:.2f}x = {measured / bound:.2f}")
            if versus is not None:
                cells.append(f"{versus[label] / secs[label]:.2f}x the eager run")
            note = "; ".join(cells[1:]) + extra
            if label.startswith("tadm") and batch == 1:
                note += f"; {tps / PAPER_TADM_TOK_S:.1f}x the paper's {PAPER_TADM_TOK_S} tok/s"
            timed_note = "" if steps[label] == T else f" (first {steps[label]} steps timed)"
            t.add("c sample", f"{label} batch {batch} T={T}{timed_note}{suffix}", cells[0], note)

    # batch 1 first: the whole trajectory
    eager = timed(1, None)
    report(1, *eager)
    # batch 1 with CUDA graphs (runtime.cuda_graphs) beside it
    note = cuda_graphs.cuda_graphs_note(True, device)
    if note is not None:
        t.add("c sample", "CUDA graphs batch 1 (runtime.cuda_graphs)", "skipped", note)
    else:
        handles = [cuda_graphs.cuda_graph_forwards(graphed_pieces(m), device) for m in models.values()]
        try:
            graphed = timed(1, None)
            count = sum(h.graphs for h in handles)
            report(1, *graphed, suffix=" CUDA graphs", versus=eager[0], extra=f"; {count} graphs")
        finally:
            for h in handles:
                h.remove()
    # the largest batch that fits, probed and timed on the first steps of a T-step trajectory
    probe = min(args.probe_steps, T)
    cap, estimate = args.max_batch, None
    if cap is None:  # from the memory estimate (`batch_cap`); CPU: 4
        cap = 4
        if device.type == "cuda":
            weights = sum(q.numel() * q.element_size() for m in models.values() for q in m.parameters())
            cap, estimate = batch_cap(p, precision, torch.cuda.get_device_properties(device).total_memory, weights)
    big, note = _largest_batch(models, L, T, device, precision, cap, probe, estimate)
    t.add("c sample", f"largest batch (first {probe} steps of T={T}, ADLM and TADM K=1)", big, note)
    if big:
        report(big, *timed(big, min(args.big_steps, T)))
    models.clear()  # the networks freed before the next section (the closures above hold the dict)
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- (d) scoring


def check_scoring(t: Table, args, device: torch.device) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from tadm.metrics.evaluator import Evaluator
    from tadm.metrics.gen_ppl import gen_ppl_ids

    shape = dict(n_layer=2, n_embd=64, n_head=2) if args.smoke else dict(n_layer=36, n_embd=1280, n_head=20)
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, **shape)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype).eval()
    ev = Evaluator(model=model, tokenizer=None, eos_id=50256, context_length=1024, name="gpt2-large-shaped", source="random")
    n, L = (4, 64) if args.smoke else (args.score_batch, 1024)
    rng = np.random.default_rng(0)
    seqs = [list(map(int, rng.integers(0, 50256, L))) for _ in range(n)]
    gen_ppl_ids(seqs[:2], ev, batch_size=2)  # warm-up
    runtime.synchronize(device)
    t0 = time.perf_counter()
    out = gen_ppl_ids(seqs, ev, batch_size=n)
    runtime.synchronize(device)
    secs = time.perf_counter() - t0
    t.add("d score", f"Gen PPL batch of {n} x {L} tokens ({'bf16' if dtype == torch.bfloat16 else 'fp32'})",
          f"{n * L / secs:,.0f} tok/s", f"ppl {out.ppl:.4g} (random weights: ~V)")
    del model


# ----------------------------------------------------------------------------- (e) post-train


def check_posttrain(t: Table, args, device: torch.device) -> None:
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.posttrain.anchored import sampling_kwargs
    from tadm.posttrain.data import CanvasBatch
    from tadm.posttrain.model import build_tadm, small_config
    from tadm.posttrain.objective import Rollout, posttrain_loss

    p = config.from_dict(config.render_profile("micro" if args.smoke else "default"))
    pt, vocab = p.posttrain, 512
    torch.manual_seed(0)
    base = DiffusionGemmaForBlockDiffusion(small_config(p, vocab, eos_id=1, pad_id=0))
    base = base.to(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    base.eval().requires_grad_(False)
    tadm = build_tadm(base, p)
    fusion, split = tadm.fusion.float(), tadm.split
    opt = torch.optim.AdamW(fusion.parameters(), lr=pt.lr, **({"fused": True} if device.type == "cuda" else {}))
    B, P, C = 2, 16, pt.canvas_length
    gen = torch.Generator(device=device).manual_seed(0)
    batch = CanvasBatch(torch.randint(2, vocab, (B, P), generator=gen, device=device),
                        torch.ones(B, P, dtype=torch.bool, device=device),
                        torch.randint(2, vocab, (B, C), generator=gen, device=device),
                        torch.full((B,), 0.5, device=device))
    rollout = Rollout(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), C, vocab)
    cfg = dataclasses.replace(pt, cache_age_probs=[0.0, 0.0, 1.0])  # the full rollout path (age 2)
    t0 = time.perf_counter()
    with runtime.autocast(device, "bf16"):
        loss, parts = posttrain_loss(split, fusion, batch, gen, cfg, rollout)
    loss.backward()
    opt.step()
    runtime.synchronize(device)
    t.add("e posttrain", "fusion step (age 2 rollout, CE + KD)", f"loss {float(loss):.3f}",
          f"{time.perf_counter() - t0:.2f} s; finite: {math.isfinite(float(loss))}")
    ids = torch.randint(2, vocab, (B, P), generator=gen, device=device)
    kw = sampling_kwargs(4 if args.smoke else pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), C, 1, 0)
    with torch.no_grad(), runtime.autocast(device, "bf16"):
        runtime.synchronize(device)
        t0 = time.perf_counter()
        out = tadm.generate(ids, attention_mask=torch.ones_like(ids, dtype=torch.bool), refresh_every=2, **kw)
        runtime.synchronize(device)
    seqs = out.sequences
    t.add("e posttrain", "generate with anchor reuse (K=2)", f"{tuple(seqs.shape)}",
          f"{time.perf_counter() - t0:.2f} s on {seqs.device}")


# ----------------------------------------------------------------------------- main

# ----------------------------------------------------------------------------- pre-flight

MIN_FREE_GIB = 8  # below this much free device memory the paper-size sections cannot run


def preflight(device: torch.device, sections: str, compile_backend: str, smoke: bool = False) -> list[tuple[str, bool, str]]:
    """What the chosen sections need of this machine, checked before any runs: (check, ok, what
    it is or what to do). Inductor (section a's compiled rows, with --compile-backend inductor)
    needs a C compiler, and on CUDA Triton and the Python headers; section e needs transformers
    >= 5.24 (DiffusionGemma's `cache=`); the sampling and training sections want a device with
    bf16 (compute capability >= 8.0) and free memory."""
    import importlib.util
    import shutil
    import sysconfig

    out = []
    if "a" in sections and compile_backend == "inductor":
        names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]  # $CC, when set, is the one
        compiler = next(filter(None, map(shutil.which, names)), None)
        out.append(("C compiler (Inductor)", compiler is not None,
                    compiler or "none on PATH: install gcc, or pass --compile-backend aot_eager"))
        if device.type == "cuda":
            header = Path(sysconfig.get_paths()["include"]) / "Python.h"
            out.append(("Python.h (Triton)", header.is_file(), str(header) if header.is_file() else
                        f"{header} missing: install the python3-dev headers, or pass --compile-backend aot_eager"))
            triton = importlib.util.find_spec("triton") is not None
            out.append(("triton import (Inductor on CUDA)", triton, "found" if triton else
                        "not installed: pip install the triton wheel matching torch, or --compile-backend aot_eager"))
    if "e" in sections:  # the DiffusionGemma section: transformers' `cache=` names (5.24 on)
        out.append(transformers_check())
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        out.append(("compute capability >= 8.0 (bf16)", (major, minor) >= (8, 0), f"{major}.{minor}"))
        free, total = torch.cuda.mem_get_info(device)
        need = 1 if smoke else MIN_FREE_GIB
        out.append((f"free device memory >= {need} GiB", free >= need * 2**30,
                    f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free"))
    return out


def transformers_check() -> tuple[str, bool, str]:
    """The pre-flight row of section e: transformers new enough for DiffusionGemma (tadm.compat)."""
    installed = compat.installed_transformers()
    ok = compat.transformers_problem() is None
    return (f"transformers >= {compat.MIN_TRANSFORMERS} (DiffusionGemma, section e)", ok,
            f"{installed}" if ok else f"{installed or 'none'} installed; put the wheel in .whl/ (benchmarks/gpu_check "
            f"installs it) or {compat.WHEEL_HINT}")


SECTIONS = {"a": check_training, "b": check_resume, "c": check_sampling, "d": check_scoring, "e": check_posttrain}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="micro sizes, any device (the test suite runs this)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--sections", default="abcde", help="which checks to run (letters of a-e)")
    ap.add_argument("--train-steps", type=int, default=12)
    ap.add_argument("--train-batch", type=int, default=64, help="global batch of the throughput run")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend of the compiled training row (default: inductor; aot_eager with --smoke)")
    ap.add_argument("--sample-steps", type=int, default=2048, help="T of the sampling check")
    ap.add_argument("--big-steps", type=int, default=64, help="steps of a T-step trajectory timed at the largest batch")
    ap.add_argument("--probe-steps", type=int, default=4, help="steps of a T-step trajectory the batch probe runs")
    ap.add_argument("--max-batch", type=int, default=None,
                    help="cap of the batch probe (default: twice the memory estimate, benchmarks' batch_cap)")
    ap.add_argument("--score-batch", type=int, default=16)
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak for MFU (default: by GPU name)")
    ap.add_argument("--out", default=None, help="write gpu_check.{md,json} into this directory")
    args = ap.parse_args(argv)
    if args.smoke:
        args.train_steps, args.train_batch = min(args.train_steps, 3), min(args.train_batch, 8)
        args.sample_steps, args.big_steps, args.max_batch = min(args.sample_steps, 8), 4, min(args.max_batch or 4, 4)
        args.probe_steps = min(args.probe_steps, 2)
    if args.compile_backend is None:
        args.compile_backend = "aot_eager" if args.smoke else "inductor"

    device = runtime.resolve_device(args.device)
    if device.type == "cuda":
        runtime.configure_backends(True)
        torch.cuda.set_device(device)
    hw = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    head = f"gpu_check{' --smoke' if args.smoke else ''} on {hw}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    print(head, flush=True)
    t, failures = Table(), 0
    checks = preflight(device, args.sections, args.compile_backend, args.smoke)
    for check, ok, detail in checks:
        t.add("pre-flight", check, "ok" if ok else "MISSING", detail)
    missing = [f"{check}: {detail}" for check, ok, detail in checks if not ok]
    if missing:
        print(f"gpu_check: pre-flight failed, no section ran: {'; '.join(missing)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for key in args.sections:
            t0 = time.perf_counter()
            try:
                if key in "ab":
                    (Path(tmp) / key).mkdir()
                    SECTIONS[key](t, args, device, Path(tmp) / key)
                else:
                    SECTIONS[key](t, args, device)
            except Exception as e:  # noqa: BLE001 - report and go on: one table for every section
                failures += 1
                traceback.print_exc()
                t.add(key, "FAILED", f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
            t.add(key, "section seconds", f"{time.perf_counter() - t0:.1f}")
    t.add("all", "total seconds", f"{time.perf_counter() - start:.1f}", f"{failures} section(s) failed")
    table = t.markdown(head)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "gpu_check_smoke" if args.smoke else "gpu_check"
        (out / f"{stem}.md").write_text(table + "\n")
        (out / f"{stem}.json").write_text(json.dumps({"setup": head, "rows": t.rows}, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
