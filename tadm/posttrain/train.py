"""Training loops of the post-train recipe: the default profile's base, and the fusion.

Both use the pretraining trainer's machinery (``tadm.train``): torchrun/DDP setup, global
batches walked from a seeded permutation, per-(step, micro-batch) generators -- so a resumed
or multi-process run takes exactly the steps of a single uninterrupted one -- and atomic,
hash-verified safetensors checkpoints that a changed config, data or code refuses to resume.

- ``train_base``: the small DiffusionGemma from scratch on the SFT canvases, uniform-state
  block diffusion; AdamW, linear warm-up then cosine to 10%, fp32; saved with
  ``save_pretrained`` (safetensors) to ``models/dg_base``.
- ``train_fusion``: TADM:Post-train -- only the fusion's parameters train and are saved
  (``models/dg_tadm``); the base is frozen in ``posttrain.precision``. AdamW with the paper's
  betas (0.95, 0.99), weight decay, cosine with warm-up, min lr ratio, gradient accumulation,
  clipping at 1.0 (App. C.1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from tadm.config import Params
from tadm.io import atomic_write_json, sha256_file
from tadm.posttrain import model as dgm
from tadm.posttrain.data import SftCanvases
from tadm.posttrain.objective import Rollout, base_loss, posttrain_loss
from tadm.train import checkpoint
from tadm.train.trainer import Dist, GlobalBatches, _seed, all_mean, setup_distributed

SFT_DIR = Path("data/sft")
# code a checkpoint depends on (a change refuses to resume it): the base's run and the fusion's
CODE = {"dg_base": ("posttrain/data.py", "posttrain/objective.py", "posttrain/model.py", "posttrain/train.py",
                    "train/checkpoint.py")}
CODE["dg_posttrain"] = CODE["dg_base"] + ("posttrain/backbone.py", "posttrain/fusion.py", "posttrain/anchored.py")


def cosine_lr(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to `peak`, then cosine decay to `min_ratio * peak` at `total`."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _fingerprint(kind: str, p: Params, sft_dir: Path, extra: dict) -> str:
    root = Path(__file__).resolve().parent.parent
    files = [root / c for c in CODE[kind]]
    payload = json.dumps({"kind": kind, "seed": p.seed, "posttrain": dataclasses.asdict(p.posttrain),
                          "data": sha256_file(sft_dir / "manifest.json"), "extra": extra,
                          "code": [sha256_file(f) for f in files]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _loop(name: str, module: torch.nn.Module, loss_fn: Callable, *, steps: int, batch: int, micro: int,
          n_data: int, lr_at: Callable[[int], float], opt: torch.optim.Optimizer, clip: float, run_dir: Path,
          fingerprint: str, seed: int, log_every: int, checkpoint_every: int, d: Dist, log=print) -> list[dict]:
    """Optimise `module`'s trainable parameters; `loss_fn(ddp_module, indices, gen)` -> (loss, logs)."""
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    names = list(params)
    start, history = 0, []
    state = checkpoint.load_latest(run_dir, names, fingerprint, log=log if d.main else (lambda *_: None))
    if state is not None:
        module.load_state_dict(state.model, strict=False)
        opt.load_state_dict(state.optimizer)
        start, history = state.step, state.extra["history"]
        if d.main:
            log(f"[{name}] resumed from step {start}")
    ddp = torch.nn.parallel.DistributedDataParallel(module) if d.world > 1 else module
    if micro % d.world:
        raise ValueError(f"{name}: {micro} micro-batches per step must divide among {d.world} processes")
    order = GlobalBatches(n_data, batch * micro, seed)
    mine = [j for j in range(micro) if j % d.world == d.rank]
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"train[{name}]", unit="step", disable=not d.main)
    t_last = time.perf_counter()
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        idx = order.indices(step)
        total, logs = 0.0, {}
        for k, j in enumerate(mine):
            gen = torch.Generator(device=d.device).manual_seed(_seed(seed, step, j))
            sync = ddp.no_sync() if (d.world > 1 and k < len(mine) - 1) else nullcontext()
            with sync:
                loss, logs = loss_fn(ddp, idx[j * batch:(j + 1) * batch], gen)
                (loss / len(mine)).backward()
            total += float(loss.detach()) / len(mine)
        grad_norm = torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        if done % log_every == 0 or done == steps:
            now = time.perf_counter()
            history.append({"step": done, "loss": all_mean(total, d), "lr": lr_at(step), "grad_norm": float(grad_norm),
                            "s_per_step": (now - t_last) / log_every, **logs})
            t_last = now
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
        if d.main and (done % checkpoint_every == 0 or done == steps):
            weights = {n: p.detach().clone() for n, p in params.items()}
            checkpoint.save(run_dir, checkpoint.TrainState(done, weights, weights, opt.state_dict(),
                                                           {"fingerprint": fingerprint, "history": history}),
                            names, keep=1 if done == steps else 2)
    if d.world > 1:
        dist.barrier()
    return history


def _pad_and_eos(tokenizer) -> tuple[int, int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("sft tokenizer: has no EOS token; DiffusionGemma's canvases need one to stop")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return pad, eos


def train_base(p: Params, tokenizer, sft_dir: Path = SFT_DIR, root: Path = Path("."), log=print) -> dict:
    """Train the default profile's DiffusionGemma on the SFT canvases (posttrain.base)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    d = setup_distributed()
    b, pt = p.posttrain.base, p.posttrain
    pad, eos = _pad_and_eos(tokenizer)
    data = SftCanvases(sft_dir, "train", pt.canvas_length, pt.max_context_tokens, pad)
    torch.manual_seed(_seed(p.seed, 0xD6))
    model = DiffusionGemmaForBlockDiffusion(dgm.small_config(p, len(tokenizer), eos, pad)).to(d.device).train()
    model.model.encoder.vision_tower.requires_grad_(False)
    model.model.encoder.embed_vision.requires_grad_(False)
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=b.lr, betas=(0.9, 0.99), weight_decay=b.weight_decay)
    fp = _fingerprint("dg_base", p, sft_dir, {"vocab": len(tokenizer)})

    def loss_fn(net, indices, gen):
        batch = data.batch(indices).to(d.device)
        return base_loss(net, batch, gen, pt.self_cond_p), {}

    history = _loop("dg_base", model, loss_fn, steps=b.steps, batch=b.batch_size, micro=1, n_data=len(data),
                    lr_at=lambda s: cosine_lr(s, b.lr, b.warmup_steps, b.steps, 0.1), opt=opt, clip=pt.grad_clip,
                    run_dir=root / "checkpoints" / "dg_base", fingerprint=fp, seed=p.seed, log_every=pt.log_every,
                    checkpoint_every=pt.checkpoint_every, d=d, log=log)
    summary = {"run": "dg_base", "steps": b.steps, "parameters": sum(q.numel() for q in trainable),
               "decoder_layers": model.config.text_config.num_hidden_layers,
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        model.eval().save_pretrained(root / dgm.BASE_DIR)
        tokenizer.save_pretrained(root / dgm.BASE_DIR)
        atomic_write_json(root / "metrics" / "posttrain" / "dg_base.json", {**summary, "history": history})
    return summary


def train_fusion(p: Params, sft_dir: Path = SFT_DIR, root: Path = Path("."), log=print) -> dict:
    """TADM:Post-train: train the fusion of a frozen DiffusionGemma (posttrain section)."""
    from tadm.data.tokenizer import load_tokenizer

    d = setup_distributed()
    pt = p.posttrain
    source = dgm.base_source(p, root)
    base = dgm.load_base(source, pt.precision, d.device)
    tokenizer = load_tokenizer(source)
    pad, _ = _pad_and_eos(tokenizer)
    data = SftCanvases(sft_dir, "train", pt.canvas_length, pt.max_context_tokens, pad)
    torch.manual_seed(_seed(p.seed, 0xF0))
    tadm = dgm.build_tadm(base, p)
    fusion = tadm.fusion.float().train()
    if d.main:
        log(f"fusion: {fusion.num_parameters:,} trainable parameters (rank {pt.fusion_rank}, split {tadm.split.split})")
    opt = torch.optim.AdamW(fusion.parameters(), lr=pt.lr, betas=tuple(pt.betas), eps=1e-8, weight_decay=pt.weight_decay)
    rollout = Rollout(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), pt.canvas_length,
                      base.config.text_config.vocab_size)
    fp = _fingerprint("dg_posttrain", p, sft_dir, {"base": source, "base_hash": _base_hash(source)})
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if pt.precision == "bf16" and d.device.type == "cuda" else nullcontext()

    def loss_fn(net, indices, gen):
        with autocast:
            return posttrain_loss(tadm.split, net, data.batch(indices).to(d.device), gen, pt, rollout)

    history = _loop("dg_posttrain", fusion, loss_fn, steps=pt.steps, batch=pt.batch_size, micro=pt.grad_accum,
                    n_data=len(data), lr_at=lambda s: cosine_lr(s, pt.lr, pt.warmup_steps, pt.steps, pt.min_lr_ratio),
                    opt=opt, clip=pt.grad_clip, run_dir=root / "checkpoints" / "dg_posttrain", fingerprint=fp,
                    seed=p.seed, log_every=pt.log_every, checkpoint_every=pt.checkpoint_every, d=d, log=log)
    summary = {"run": "dg_posttrain", "steps": pt.steps, "fusion_parameters": fusion.num_parameters,
               "split": list(tadm.split.split), "base_model": source,
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        dgm.save_fusion(tadm, root / dgm.TADM_DIR, source, {"steps": pt.steps})
        atomic_write_json(root / "metrics" / "posttrain" / "dg_posttrain.json", {**summary, "history": history})
    return summary


def _base_hash(source: str) -> str:
    """Identity of a local base checkpoint (its weight files), or the hub id itself."""
    path = Path(source)
    if not path.is_dir():
        return source
    return hashlib.sha256("".join(sha256_file(f) for f in sorted(path.glob("*.safetensors"))).encode()).hexdigest()[:16]
