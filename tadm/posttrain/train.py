"""Training loops of the post-train recipe: the default profile's base, and the fusion.

Both use the pretraining trainer's machinery (``tadm.train``, ``tadm.runtime``): the device of
``runtime.device``, DDP under torchrun, global batches walked from a seeded permutation,
per-(step, micro-batch) generators -- so a resumed run takes exactly the steps of an
uninterrupted one -- and atomic, hash-verified safetensors checkpoints that refuse to resume
under other settings (``--restart`` moves them aside).

Global batch: every process does ``grad_accum`` micro-batches of ``batch_size`` examples per
step, so a step's global batch is batch_size x grad_accum x processes (the paper: 1 x 4 x 4
GPUs = 16). The examples of a step and their random draws depend only on (seed, step) and the
global batch size, so N processes give the results of 1 process with grad_accum x N (up to the
order in which gradients are summed) -- not those of 1 process with the same grad_accum.

- ``train_base``: the small DiffusionGemma from scratch on the SFT canvases, uniform-state
  block diffusion; AdamW, linear warm-up then cosine to 10%, fp32; saved with
  ``save_pretrained`` (safetensors) to ``models/dg_base``.
- ``train_fusion``: TADM:Post-train -- only the fusion's parameters train and are saved
  (``models/dg_tadm``); the base is frozen in ``posttrain.precision``. AdamW with the paper's
  betas (0.95, 0.99), weight decay, cosine with warm-up, min lr ratio, gradient accumulation,
  clipping at 1.0 (App. C.1). ``fresh=True``: Table 1's control, the same recipe with the anchor
  always fresh (``models/dg_fresh``, checkpoints ``dg_posttrain_fresh``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from tadm import memory_estimate, runtime
from tadm.config import Params
from tadm.data import chat
from tadm.io import atomic_write_json, sha256_file
from tadm.posttrain import model as dgm
from tadm.posttrain.data import SftCanvases
from tadm.posttrain.objective import Rollout, base_loss, posttrain_loss
from tadm.runtime import Dist, all_mean
from tadm.train import checkpoint
from tadm.train.divergence import FiniteWatch
from tadm.train.trainer import GlobalBatches, _seed, adamw, hold_run, resume_state, wrap

SFT_DIR = Path("data/sft")
# code a checkpoint depends on (a change refuses to resume it): the base's run and the fusion's
CODE = {"dg_base": ("posttrain/data.py", "posttrain/objective.py", "posttrain/model.py", "posttrain/train.py",
                    "train/checkpoint.py")}
CODE["dg_posttrain"] = CODE["dg_base"] + ("posttrain/backbone.py", "posttrain/fusion.py", "posttrain/anchored.py")
CODE["dg_posttrain_fresh"] = CODE["dg_posttrain"]
# Settings that define each run's objective (recorded in its checkpoints; a change is refused).
# The steps stay in: both runs decay the learning rate on a cosine that ends at their `steps`,
# so more steps change the learning rate of every step after warm-up -- a run cannot be
# extended, only restarted. What is left out: logging and checkpoint cadence, Table 1's
# evaluation, and (for the fusion) the base section, whose weights are fingerprinted themselves.
BASE_KEYS = ("seed", "base", "shared_layers", "anchor_layers", "denoiser_layers", "canvas_length", "max_context_tokens",
             "self_cond_p", "grad_clip")
FUSION_IGNORES = ("base", "checkpoint_every", "log_every", "refresh_every", "tasks", "task_sources", "eval_examples",
                  "eval_batch_size", "seeds")


def cosine_lr(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to `peak`, then cosine decay to `min_ratio * peak` at `total`."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _settings(kind: str, p: Params, sft_dir: Path, extra: dict) -> dict:
    root = Path(__file__).resolve().parent.parent
    pt = dataclasses.asdict(p.posttrain)
    keep = (lambda k: k in BASE_KEYS) if kind == "dg_base" else (lambda k: k not in FUSION_IGNORES)
    return {"kind": kind, "posttrain": {k: v for k, v in pt.items() if keep(k)},
            "data": sha256_file(sft_dir / "manifest.json"), "extra": extra,
            "code": hashlib.sha256("".join(sha256_file(root / c) for c in CODE[kind]).encode()).hexdigest()}


def micro_batches(indices: list[int], batch: int, micro: int, d: Dist) -> list[tuple[int, list[int]]]:
    """This process's share of a step's global batch `indices` (batch * micro * world of them):
    its m-th micro-batch is global micro-batch j = m * world + rank, examples
    [j*batch, (j+1)*batch). Over all processes: every j once, whatever the world size."""
    return [(j, indices[j * batch:(j + 1) * batch]) for j in (m * d.world + d.rank for m in range(micro))]


def _loop(name: str, module: torch.nn.Module, loss_fn: Callable, *, steps: int, batch: int, micro: int,
          n_data: int, lr_at: Callable[[int], float], opt: torch.optim.Optimizer, clip: float, run_dir: Path,
          settings: dict[str, Any], seed: int, log_every: int, checkpoint_every: int, d: Dist, log=print,
          restart: bool = False, compile: bool = False, command: str | None = None) -> list[dict]:
    """Optimise `module`'s trainable parameters; `loss_fn(net, indices, gen)` -> (loss, logs).

    Each process does `micro` micro-batches of `batch` examples per step: global micro-batch
    j = m * world + rank (this process's m-th) takes examples [j*batch, (j+1)*batch) of the
    step's global batch (batch * micro * world indices of the seeded data order) and draws
    from a generator seeded by (seed, step, j). `settings` define the run (a checkpoint of other
    settings is refused); `restart` moves old checkpoints aside; `compile` -> torch.compile of
    the trained module's forward; `command` is named in errors as the one to rerun. The run
    holds `run_dir`'s lock throughout (a second run on it is refused, naming this one)."""
    with hold_run(run_dir, d, command):
        return _locked_loop(name, module, loss_fn, steps=steps, batch=batch, micro=micro, n_data=n_data, lr_at=lr_at,
                            opt=opt, clip=clip, run_dir=run_dir, settings=settings, seed=seed, log_every=log_every,
                            checkpoint_every=checkpoint_every, d=d, log=log, restart=restart, compile=compile,
                            command=command)


def _locked_loop(name: str, module: torch.nn.Module, loss_fn: Callable, *, steps: int, batch: int, micro: int,
                 n_data: int, lr_at: Callable[[int], float], opt: torch.optim.Optimizer, clip: float, run_dir: Path,
                 settings: dict[str, Any], seed: int, log_every: int, checkpoint_every: int, d: Dist, log=print,
                 restart: bool = False, compile: bool = False, command: str | None = None) -> list[dict]:
    """:func:`_loop`'s body, run under the lock of `run_dir`."""
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    names = list(params)
    quiet = log if d.main else (lambda *_: None)
    if d.world > 1:
        quiet(f"[{name}] {d.world} processes on {d.device.type}, {micro} micro-batches of {batch} each per step "
              f"(global batch {batch * micro * d.world})")
    start, history = 0, []
    fp = checkpoint.fingerprint(settings)
    state = resume_state(run_dir, names, settings, steps=steps, steps_key="steps", restart=restart,
                         hint=f"`{command or 'python -m tadm ' + name.replace('_', '-')} --restart`", d=d, log=quiet,
                         expected={n: p.detach() for n, p in params.items()})
    if state is not None:
        module.load_state_dict(state.model, strict=False)  # host tensors copied onto the module's device
        checkpoint.restore_optimizer(opt, state.optimizer)
        start, history = state.step, state.extra["history"]
        quiet(f"[{name}] resumed from step {start}")
        del state
    ddp, net = wrap(module, d, compile)
    order = GlobalBatches(n_data, batch * micro * d.world, seed)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"train[{name}]", unit="step", disable=not d.main)
    t_last = time.perf_counter()
    watch = FiniteWatch(name, d.device)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        mine = micro_batches(order.indices(step), batch, micro, d)
        total, logs = torch.zeros((), dtype=torch.float64, device=d.device), {}  # read once per logged step
        for k, (j, examples) in enumerate(mine):
            gen = torch.Generator(device=d.device).manual_seed(_seed(seed, step, j))
            sync = ddp.no_sync() if (d.world > 1 and k < len(mine) - 1) else nullcontext()
            with sync:
                loss, logs = loss_fn(net, examples, gen)
                (loss / len(mine)).backward()
            total += loss.detach().double() / len(mine)
        grad_norm = torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        watch.observe(done, total, grad_norm)
        saved = done % checkpoint_every == 0 or done == steps
        if done % log_every == 0 or saved:  # a host sync these steps make anyway: stop a diverged run first
            watch.check(d.world, lambda: checkpoint.last_good(run_dir))
        if done % log_every == 0 or done == steps:
            loss_value = all_mean(float(total), d)
            now = time.perf_counter()
            history.append({"step": done, "loss": loss_value, "lr": lr_at(step), "grad_norm": float(grad_norm),
                            "s_per_step": (now - t_last) / log_every,
                            **{k: float(v) if torch.is_tensor(v) else v for k, v in logs.items()}})
            t_last = now
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
        if d.main and saved:
            weights = {n: p.detach().clone() for n, p in params.items()}
            extra = {"fingerprint": fp, "history": history, "settings": settings}
            checkpoint.save(run_dir, checkpoint.TrainState(done, weights, weights, opt.state_dict(), extra),
                            names, keep=1 if done == steps else 2)
    runtime.barrier(d)
    return history


def _pad_and_eos(tokenizer) -> tuple[int, int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("sft tokenizer: has no EOS token; DiffusionGemma's canvases need one to stop")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return pad, eos


def train_base(p: Params, tokenizer, sft_dir: Path = SFT_DIR, root: Path = Path("."), log=print,
               restart: bool = False) -> dict:
    """Train the default profile's DiffusionGemma on the SFT canvases (posttrain.base)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    d = runtime.setup(p.runtime)
    b, pt = p.posttrain.base, p.posttrain
    if pt.base_model == "local":  # before anything is allocated: will it fit this machine?
        memory_estimate.require(p, lambda q, on_gpu: memory_estimate.base_estimate(q, on_gpu), "posttrain.base")
    chat.add_chat_tokens(tokenizer)  # the SFT canvases' turn markers (saved with the base below)
    pad, eos = _pad_and_eos(tokenizer)
    data = SftCanvases(sft_dir, "train", pt.canvas_length, pt.max_context_tokens, pad)
    torch.manual_seed(_seed(pt.seed, 0xD6))
    with torch.device(d.device):
        model = DiffusionGemmaForBlockDiffusion(dgm.small_config(p, len(tokenizer), eos, pad)).train()
    model.model.encoder.vision_tower.requires_grad_(False)
    model.model.encoder.embed_vision.requires_grad_(False)
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = adamw(trainable, d.device, lr=b.lr, betas=(0.9, 0.99), weight_decay=b.weight_decay)
    settings = _settings("dg_base", p, sft_dir, {"vocab": len(tokenizer)})

    def loss_fn(net, indices, gen):
        batch = data.batch(indices).to(d.device)
        return base_loss(net, batch, gen, pt.self_cond_p), {}

    history = _loop("dg_base", model, loss_fn, steps=b.steps, batch=b.batch_size, micro=1, n_data=len(data),
                    lr_at=lambda s: cosine_lr(s, b.lr, b.warmup_steps, b.steps, 0.1), opt=opt, clip=pt.grad_clip,
                    run_dir=root / "checkpoints" / "dg_base", settings=settings, seed=pt.seed, log_every=pt.log_every,
                    checkpoint_every=pt.checkpoint_every, d=d, log=log, restart=restart, compile=p.runtime.compile,
                    command="python -m tadm dg-base")
    summary = {"run": "dg_base", "steps": b.steps, "parameters": sum(q.numel() for q in trainable),
               "decoder_layers": model.config.text_config.num_hidden_layers,
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        model.eval().save_pretrained(root / dgm.BASE_DIR)
        tokenizer.save_pretrained(root / dgm.BASE_DIR)
        atomic_write_json(root / "metrics" / "posttrain" / "dg_base.json", {**summary, "history": history})
    return summary


def train_fusion(p: Params, sft_dir: Path = SFT_DIR, root: Path = Path("."), log=print,
                 restart: bool = False, fresh: bool = False) -> dict:
    """TADM:Post-train: train the fusion of a frozen DiffusionGemma (posttrain section).

    `fresh`: Table 1's control instead -- the same recipe (data, steps, seed, optimiser, CE + KD,
    rollouts) with the anchor recomputed at every step (``objective.posttrain_loss(fresh=True)``),
    run ``dg_posttrain_fresh``, saved to ``models/dg_fresh``."""
    name = "dg_posttrain_fresh" if fresh else "dg_posttrain"
    command = "python -m tadm dg-posttrain" + (" --fresh-anchor" if fresh else "")
    from tadm.data.tokenizer import load_tokenizer

    d = runtime.setup(p.runtime)
    pt = p.posttrain
    source = dgm.base_source(p, root)
    base = dgm.load_base(source, pt.precision, d.device)
    tokenizer = load_tokenizer(source)
    pad, _ = _pad_and_eos(tokenizer)
    data = SftCanvases(sft_dir, "train", pt.canvas_length, pt.max_context_tokens, pad)
    torch.manual_seed(_seed(pt.seed, 0xF0))
    tadm = dgm.build_tadm(base, p, fresh=fresh)
    fusion = tadm.fusion.float().train()
    if d.main:
        log(f"{'fresh-anchor control' if fresh else 'fusion'}: {fusion.num_parameters:,} trainable parameters "
            f"(rank {pt.fusion_rank}, split {tadm.split.split})")
    opt = adamw(fusion.parameters(), d.device, lr=pt.lr, betas=tuple(pt.betas), eps=1e-8, weight_decay=pt.weight_decay)
    rollout = Rollout(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), pt.canvas_length,
                      base.config.text_config.vocab_size)
    settings = _settings(name, p, sft_dir, {"base": source, "base_hash": _base_hash(source)})
    autocast = runtime.autocast(d.device, pt.precision)

    def loss_fn(net, indices, gen):
        with autocast:
            return posttrain_loss(tadm.split, net, data.batch(indices).to(d.device), gen, pt, rollout, fresh=fresh)

    history = _loop(name, fusion, loss_fn, steps=pt.steps, batch=pt.batch_size, micro=pt.grad_accum,
                    n_data=len(data), lr_at=lambda s: cosine_lr(s, pt.lr, pt.warmup_steps, pt.steps, pt.min_lr_ratio),
                    opt=opt, clip=pt.grad_clip, run_dir=root / "checkpoints" / name, settings=settings,
                    seed=pt.seed, log_every=pt.log_every, checkpoint_every=pt.checkpoint_every, d=d, log=log,
                    restart=restart, compile=p.runtime.compile, command=command)
    summary = {"run": name, "steps": pt.steps, "fusion_parameters": fusion.num_parameters,
               "split": list(tadm.split.split), "base_model": source,
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        dgm.save_fusion(tadm, root / (dgm.FRESH_DIR if fresh else dgm.TADM_DIR), source, {"steps": pt.steps})
        atomic_write_json(root / "metrics" / "posttrain" / f"{name}.json", {**summary, "history": history})
    return summary


def _base_hash(source: str) -> str:
    """Identity of a local base checkpoint (its weight files), or the hub id itself."""
    path = Path(source)
    if not path.is_dir():
        return source
    return hashlib.sha256("".join(sha256_file(f) for f in sorted(path.glob("*.safetensors"))).encode()).hexdigest()[:16]
