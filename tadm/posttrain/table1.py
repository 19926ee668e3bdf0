"""Table 1: the frozen DiffusionGemma against TADM:Post-train at K = 1, 2, 3, and a control.

The control ("Control (fresh anchor)", ``models/dg_fresh``) is trained by the same trainer on
the same data, steps and seed with the same objective (CE + KD) and fusion size, but its anchor
is recomputed at every step (``train_fusion(fresh=True)``); it is evaluated with K = 1. The
CE term fine-tunes on the SFT data whether or not the anchor is reused, so TADM's delta vs the
base mixes that fine-tuning with the effect of reuse; its delta vs the control isolates reuse.

For every task of ``posttrain.tasks`` and every seed of ``posttrain.seeds``, each method
generates with DiffusionGemma's entropy-bound sampler (``generate`` of transformers for the
base; the same loop with the anchor refreshed every K steps for TADM) and is scored:

    accuracy (mean over seeds, in %), delta in points vs the base and vs the control (each
             ± the sd over seeds of the per-seed differences: every method is sampled with
             the same seeds),
    tokens/s end to end (prompt encoding + every denoising step + decoding of the canvases;
             all generated canvas positions counted), timed on the scored generations
             themselves: the median over every full prompt batch of every seed, the methods
             interleaved (each seed runs every method in turn, after one warm-up ``generate``
             per method, the FLOP count below),
    throughput x = tokens/s over the base's,
    compute x    = decoder-layer calls over the base's (the paper's unit), counted by hooks on the
                   decoder layers during the scored generations,
    FLOP bound x = the base's FLOPs over the method's, counted by ``torch.utils.flop_counter``
                   during a whole ``generate`` call (encoder prefill, every decoder layer,
                   self-conditioning, fusion, LM head), and measured / bound;
    decoder      = the same two ratios for the per-step decoder calls alone (what TADM changes),
                   beside the decoder's share of the wall time: the rest -- the sampler's
                   categorical draw over the vocabulary, entropy, sort -- has no FLOPs the
                   counter sees, costs every method the same, and so dilutes the end-to-end ratio.

``run`` writes ``results/table1.json``; ``frame`` and ``to_markdown`` make the table.

Where it runs: the device and autocast of a `tadm.runtime.Dist` (from ``runtime.setup(p.runtime)``;
the notebook overrides runtime.device / runtime.precision). With runtime.nproc > 1 ``run``
relaunches itself under torchrun (`tadm.experiments.worker`): each prompt batch (its seed is
(seed, first example)) is generated and scored by one process (batch j by process j mod N), the
completions, per-example correctness and decoder-layer calls are gathered, so accuracies and
compute are those of one process; each process times its own batches (on its own device) and
the main process's timings are kept.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from tqdm import tqdm

from tadm import runtime
from tadm.config import Params
from tadm.data import arithmetic, chat
from tadm.errors import DataError
from tadm.io import atomic_write_json
from tadm.posttrain import model as dgm
from tadm.posttrain.anchored import TimeAnchoredDiffusionGemma, sampling_kwargs
from tadm.posttrain.data import arithmetic_eval_set, left_pad

# max_new_tokens per task in the paper (Sec. 6); arithmetic: one canvas
PAPER_LENGTHS = {"gsm8k": 1024, "humaneval": 1024, "gpqa_diamond": 2048, "mmlu_pro": 2048,
                 "livecodebench": 2000, "aime": 4096}


def _cpu_attention_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


# torch's counter knows the CUDA attention kernels but not the CPU one; count it the same way
_EXTRA_FLOP_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of `fn()` (matmuls and attention), as torch counts them."""
    with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter:
        fn()
    return counter.get_total_flops()


@dataclass
class Task:
    name: str
    prompts: list[str]
    score: Callable[[int, str], bool]  # (example index, completion) -> correct
    max_new_tokens: int


def arithmetic_task(sft_dir: Path, limit: int, canvas_length: int) -> Task:
    rows = arithmetic_eval_set(sft_dir, limit)
    return Task("arithmetic", [r["prompt"] for r in rows],
                lambda i, text: arithmetic.is_correct(text, rows[i]["answer"]), canvas_length)


def load_task(name: str, p: Params, sft_dir: Path, unsafe_host_execution: bool = False) -> Task:
    """A Table 1 task: its prompts, its scorer and its generation length. `unsafe_host_execution`
    (default off) lets HumanEval / LiveCodeBench run completions on the host where the sandbox
    cannot isolate them (see `tadm.tasks.sandbox`); otherwise scoring them refuses there."""
    pt = p.posttrain
    if name == "arithmetic":
        return arithmetic_task(sft_dir, pt.eval_examples, pt.canvas_length)
    from tadm.tasks.suite import build_task  # the paper's benchmarks (hub or local files)

    source = pt.task_sources.get(name) or (p.sft.gsm8k if name == "gsm8k" else None)
    prompts, score = build_task(name, source, limit=pt.eval_examples, unsafe_host_execution=unsafe_host_execution)
    return Task(name, prompts, score, PAPER_LENGTHS[name])


class DecoderLayerCalls:
    """Counts calls of the base's canvas-decoder layers (the paper's compute unit) with forward
    hooks, whichever path -- transformers' decoder or the S / A / D split -- makes them."""

    def __init__(self, base):
        self.calls = 0
        self._hooks = [layer.register_forward_hook(self._hook) for layer in base.model.decoder.layers]

    def _hook(self, *_):
        self.calls += 1

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


class DecoderProbe:
    """Time (and optionally FLOPs) spent in the per-step decoder calls of ``generate``.

    ``generate`` calls ``self.forward`` of the model once per denoising step; the probe shadows
    that attribute with a timed wrapper for the duration of a ``with`` block.
    """

    def __init__(self, owner, count_flops: bool = False):
        self.owner, self.count_flops = owner, count_flops
        self.seconds, self.flops = 0.0, 0

    def __enter__(self) -> "DecoderProbe":
        inner = self.owner.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if self.count_flops:
                with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter:
                    out = inner(*args, **kwargs)
                self.flops += counter.get_total_flops()
            else:
                out = inner(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            return out

        self.owner.forward = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.owner.forward  # the class's forward again


CONTROL = "Control (fresh anchor)"  # Table 1's control row (models/dg_fresh, K = 1)


class Method:
    """One row of Table 1: the base (refresh_every None), TADM with K, or the fresh-anchor
    control (a TimeAnchoredDiffusionGemma whose fusion acts on the fresh anchor, K = 1)."""

    def __init__(self, label: str, base, tadm: TimeAnchoredDiffusionGemma, refresh_every: int | None):
        self.label, self.base, self.tadm, self.k = label, base, tadm, refresh_every

    @property
    def decoder_owner(self):
        """The object whose ``forward`` generate calls once per denoising step."""
        return self.base if self.k is None else self.tadm

    def generate(self, ids, mask, **kw):
        if self.k is None:
            return self.base.generate(ids, attention_mask=mask, **kw)
        return self.tadm.generate(ids, attention_mask=mask, refresh_every=self.k, **kw)

    def layer_calls_per_step(self, steps: int) -> float:
        s, a, d = self.tadm.split.split
        if self.k is None:
            return float(s + a + d)
        return (s + d) + a * (-(-steps // self.k)) / steps


class Runner:
    """Generates with each method on a task (prompt batches, seeds) and times it; the prompt
    batches are split over the processes of `dist` (None: one process on the CPU)."""

    def __init__(self, p: Params, tokenizer, methods: list[Method], dist: runtime.Dist | None = None):
        self.p, self.tok, self.methods = p, tokenizer, methods
        self.dist = dist or runtime.Dist()
        self.device = self.dist.device
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos

    def kwargs(self, max_new_tokens: int) -> dict:
        pt = self.p.posttrain
        return sampling_kwargs(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), max_new_tokens, self.eos, self.pad)

    def encode(self, prompts: list[str]):
        ids = chat.encode_prompts(self.tok, prompts)  # no-think chat turns, as the SFT canvases
        x, m = left_pad(ids, self.pad)
        return x.to(self.device), m.to(self.device)

    def decode(self, sequences: torch.Tensor, prompt_len: int) -> list[str]:
        texts = []
        for row in sequences[:, prompt_len:].tolist():
            if self.eos in row:
                row = row[: row.index(self.eos)]
            texts.append(self.tok.decode(row, skip_special_tokens=True))
        return texts

    def batch_starts(self, n: int) -> list[int]:
        return list(range(0, n, self.p.posttrain.eval_batch_size))

    @torch.no_grad()
    def generate_batch(self, method: Method, prompts: list[str], max_new_tokens: int, seed: int,
                       lo: int) -> tuple[list[str], float, float]:
        """Completions of one prompt batch (examples lo, lo + 1, ...), seeded with (seed, lo), and
        the wall time of its ``generate`` call and of the decoder calls inside it."""
        ids, mask = self.encode(prompts)
        torch.manual_seed(seed * 1_000_003 + lo)
        with DecoderProbe(method.decoder_owner) as probe, self.dist.autocast():
            runtime.synchronize(self.device)
            t0 = time.perf_counter()
            seqs = method.generate(ids, mask, **self.kwargs(max_new_tokens)).sequences
            runtime.synchronize(self.device)
            seconds = time.perf_counter() - t0
        return self.decode(seqs, ids.shape[1]), seconds, probe.seconds

    def accuracy(self, method: Method, task: Task, seed: int) -> tuple[float, list[str], int, list[tuple[int, float, float]]]:
        """Accuracy in %, the completions, and the decoder-layer calls the generation made (every
        process's batches: generated, scored and counted where they ran, then gathered); and this
        process's timed batches, (prompts, seconds of ``generate``, seconds in its decoder calls)."""
        bs, starts, d = self.p.posttrain.eval_batch_size, self.batch_starts(len(task.prompts)), self.dist
        counter = DecoderLayerCalls(method.base)
        mine, timed = [], []
        try:
            for j in runtime.shard(len(starts), d):
                lo = starts[j]
                prompts = task.prompts[lo: lo + bs]
                texts, seconds, decoder_seconds = self.generate_batch(method, prompts, task.max_new_tokens, seed, lo)
                mine.append((texts, [bool(task.score(lo + k, t)) for k, t in enumerate(texts)]))
                timed.append((len(prompts), seconds, decoder_seconds))
        finally:
            counter.close()
        batches = runtime.gather(mine, len(starts), d)
        calls = sum(runtime.gather([counter.calls], d.world, d))
        texts = [t for ts, _ in batches for t in ts]
        correct = [c for _, cs in batches for c in cs]
        return 100.0 * sum(correct) / len(correct), texts, calls, timed

    @torch.no_grad()
    def flops(self, task: Task) -> dict[str, dict]:
        """Per method on the first prompt batch: FLOPs of a whole ``generate`` and of its decoder
        calls (not timed; it is also every method's warm-up before the timed, scored runs)."""
        ids, mask = self.encode(task.prompts[: self.p.posttrain.eval_batch_size])
        kw = self.kwargs(task.max_new_tokens)
        out = {}
        for m in self.methods:
            torch.manual_seed(0)
            with DecoderProbe(m.decoder_owner, count_flops=True) as probe, self.dist.autocast():
                total = count_flops(lambda: m.generate(ids, mask, **kw))
            out[m.label] = {"flops": total, "decoder_flops": probe.flops}
        return out

    def tokens_per_prompt(self, task: Task) -> int:
        """Generated canvas positions per prompt (every canvas counted whole)."""
        canvas = self.p.posttrain.canvas_length
        return (-(-task.max_new_tokens // canvas)) * canvas


def throughput(timed: list[tuple[int, float, float]], tokens_per_prompt: int) -> dict:
    """Speed of one method from its timed batches (prompts, seconds, decoder seconds) over every
    seed: the batches of the largest size (the full ones; a last, shorter batch of a task runs
    at another speed), their times, and tokens/s = its generated tokens / their median time."""
    size = max(n for n, _, _ in timed)
    full = [(s, ds) for n, s, ds in timed if n == size]
    seconds = [s for s, _ in full]
    return {"batch_prompts": size, "seconds": seconds, "decoder_seconds": [ds for _, ds in full],
            "tokens_per_s": size * tokens_per_prompt / statistics.median(seconds)}


def build_methods(p: Params, root: Path = Path("."), dist: runtime.Dist | None = None,
                  control: bool = True) -> tuple[list[Method], object]:
    """The base, the fresh-anchor control (`control`; its fusion from models/dg_fresh) and TADM
    at every K of posttrain.refresh_every (trained fusion loaded), on the device of `dist`
    (None: `runtime.setup(p.runtime)`)."""
    from tadm.data.tokenizer import load_tokenizer

    d = dist or runtime.setup(p.runtime)
    source = dgm.base_source(p, root)
    base = dgm.load_base(source, p.posttrain.precision, d.device)
    tadm = dgm.build_tadm(base, p)
    dgm.load_fusion(tadm, root / dgm.TADM_DIR)
    tadm.fusion.to(dtype=base.dtype).eval()
    methods = [Method("Base", base, tadm, None)]
    if control:
        fresh = dgm.build_tadm(base, p, fresh=True)
        dgm.load_fusion(fresh, root / dgm.FRESH_DIR)
        fresh.fusion.to(dtype=base.dtype).eval()
        methods.append(Method(CONTROL, base, fresh, 1))
    methods += [Method(f"TADM K={k}", base, tadm, k) for k in p.posttrain.refresh_every]
    return methods, load_tokenizer(source)


def run(p: Params, root: Path = Path("."), sft_dir: Path = Path("data/sft"), out: Path | None = None,
        log=print, dist: runtime.Dist | None = None, unsafe_host_execution: bool = False,
        control: bool = True) -> dict:
    """Score every method on every task and seed; measure speed; write results/table1.json.
    `unsafe_host_execution`: see `load_task` (an explicit opt-in; off by default). `control`:
    include the fresh-anchor control row (models/dg_fresh).
    On the device of `dist` (None: `runtime.setup(p.runtime)`); with runtime.nproc > 1 (and not
    under torchrun already) in torchrun workers (`tadm.experiments.worker`), whose result is
    returned."""
    from tadm.experiments import worker

    if worker.needs_launch(p):
        return worker.launch("table1", p, {"root": str(root), "sft_dir": str(sft_dir),
                                           "out": str(out or root / "results" / "table1.json"),
                                           "unsafe_host_execution": unsafe_host_execution, "control": control})
    d = dist or runtime.setup(p.runtime)
    methods, tok = build_methods(p, root, d, control)
    runner = Runner(p, tok, methods, d)
    pt = p.posttrain
    results = {"steps": pt.sample_steps, "split": list(methods[0].tadm.split.split),
               "fusion_parameters": methods[0].tadm.fusion.num_parameters, "tasks": {}}
    for name in pt.tasks:
        task = load_task(name, p, sft_dir, unsafe_host_execution)
        if not task.prompts:
            raise DataError(f"task {name}: no evaluation examples")
        flops = runner.flops(task)  # also the warm-up of every method
        runs = {m.label: {"accs": [], "examples": None, "calls": 0, "timed": []} for m in methods}
        bar = tqdm(total=len(methods) * len(pt.seeds), desc=f"table1[{name}]", unit="run", disable=not d.main)
        for seed in pt.seeds:  # methods interleaved, so machine-speed drift hits them alike
            for m in methods:
                acc, texts, n, timed = runner.accuracy(m, task, seed)
                r = runs[m.label]
                r["accs"].append(acc)
                r["examples"] = r["examples"] or texts[:5]
                r["calls"] += n
                r["timed"] += timed
                bar.update()
        bar.close()
        rows = {}
        for m in methods:
            r = runs[m.label]
            rows[m.label] = {"accuracy": statistics.mean(r["accs"]), "accuracy_seeds": r["accs"],
                             "accuracy_sd": statistics.stdev(r["accs"]) if len(r["accs"]) > 1 else 0.0,
                             "refresh_every": m.k, "control": m.label == CONTROL, "layer_calls": r["calls"],
                             "layer_calls_per_step": m.layer_calls_per_step(pt.sample_steps),
                             "examples": r["examples"], **flops[m.label],
                             **throughput(r["timed"], runner.tokens_per_prompt(task))}
        results["tasks"][name] = {"n": len(task.prompts), "methods": rows}
        if d.main:
            log(f"table1[{name}]: " + ", ".join(f"{k} {v['accuracy']:.1f}%" for k, v in rows.items()))
    if d.main:
        atomic_write_json(out or root / "results" / "table1.json", results)
    return results


# ----------------------------------------------------------------------------- the table


def paired_delta(m: dict, ref: dict | None) -> tuple[float, float]:
    """Accuracy of `m` minus `ref` in points, and the sd over seeds of the per-seed differences
    (both rows are sampled with the same seeds); NaN without a reference row."""
    if ref is None:
        return float("nan"), float("nan")
    diffs = [a - b for a, b in zip(m["accuracy_seeds"], ref["accuracy_seeds"])]
    return m["accuracy"] - ref["accuracy"], statistics.stdev(diffs) if len(diffs) > 1 else 0.0


def frame(results: dict):
    """Table 1 as a pandas frame: one line per (task, method)."""
    import pandas as pd

    lines = []
    for task, r in results["tasks"].items():
        base = r["methods"]["Base"]
        control = r["methods"].get(CONTROL)
        for label, m in r["methods"].items():
            speedup = m["tokens_per_s"] / base["tokens_per_s"]
            bound = base["flops"] / m["flops"]
            dec_speedup = statistics.median(base["decoder_seconds"]) / statistics.median(m["decoder_seconds"])
            dec_bound = base["decoder_flops"] / m["decoder_flops"]
            delta, delta_sd = paired_delta(m, base)
            delta_ctl, delta_ctl_sd = paired_delta(m, control)
            lines.append({"task": task, "method": label, "accuracy": m["accuracy"], "sd": m["accuracy_sd"],
                          "delta_pts": delta, "delta_sd": delta_sd,
                          "delta_control_pts": delta_ctl, "delta_control_sd": delta_ctl_sd,
                          "tokens_per_s": m["tokens_per_s"],
                          "throughput_x": speedup,
                          "compute_x": m["layer_calls"] / base["layer_calls"],
                          "flop_bound_x": bound, "measured_over_bound": speedup / bound,
                          "decoder_share": statistics.median(m["decoder_seconds"]) / statistics.median(m["seconds"]),
                          "decoder_speedup_x": dec_speedup, "decoder_bound_x": dec_bound,
                          "decoder_measured_over_bound": dec_speedup / dec_bound})
    return pd.DataFrame(lines)


def _pm(v: float, sd: float) -> str:
    return "–" if v != v else f"{v:+.1f} ± {sd:.1f}"


def to_markdown(df) -> str:
    head = ("| Task | Method | Accuracy (%) | Δ vs base (pts) | Δ vs control (pts) | Tokens/s | Throughput | Compute "
            "| FLOP bound | measured/bound | decoder share of time | decoder speed-up | decoder FLOP bound | measured/bound |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.task} | {r.method} | {r.accuracy:.1f} ± {r.sd:.1f} | {_pm(r.delta_pts, r.delta_sd)} | "
        f"{_pm(r.delta_control_pts, r.delta_control_sd)} | {r.tokens_per_s:,.0f} | "
        f"{r.throughput_x:.2f}x | {r.compute_x:.2f}x | {r.flop_bound_x:.2f}x | {r.measured_over_bound:.2f} | "
        f"{r.decoder_share:.0%} | {r.decoder_speedup_x:.2f}x | {r.decoder_bound_x:.2f}x | {r.decoder_measured_over_bound:.2f} |\n"
        for r in df.itertuples())
    note = ("\nΔ: accuracy minus the base's / the control's, ± the sd over seeds of the per-seed differences. "
            "Control: the same fusion recipe (data, steps, seed, CE + KD) trained and evaluated with the anchor "
            "recomputed at every step; Δ vs control isolates anchor reuse from the fine-tuning of the CE term.\n")
    return head + body + note


def metrics_dict(df) -> dict:
    out = {}
    for r in df.itertuples():
        key = f"{r.task}_{r.method.replace(' ', '').replace('=', '').replace('(', '').replace(')', '')}"
        deltas = {f"{key}_delta_pts": round(r.delta_pts, 3)}
        if r.delta_control_pts == r.delta_control_pts:  # NaN without a control row
            deltas[f"{key}_delta_control_pts"] = round(r.delta_control_pts, 3)
        out.update({f"{key}_accuracy": round(r.accuracy, 3), **deltas, f"{key}_throughput_x": round(r.throughput_x, 4),
                    f"{key}_compute_x": round(r.compute_x, 4), f"{key}_measured_over_bound": round(r.measured_over_bound, 4),
                    f"{key}_decoder_measured_over_bound": round(r.decoder_measured_over_bound, 4)})
    return out
