"""The masked diffusion LM the ASRD comparison runs on: MDLM trained on the two tasks.

ASRD is training-free, but it needs a masked (absorbing-state) diffusion LM that solves its
tasks; the Table 2 models are unconditional and far too small for that. This trains an MDLM
(`tadm.models.mdlm`, the `model` section's width and depth) on the fixed-layout
[prompt | response] sequences of both tasks (`tadm.asrd.tasks`): the prompt is never masked,
the response is masked as in MDLM (log-linear schedule, antithetic t) and the loss is MDLM's
continuous-time NELBO over the response, per response token. AdamW, warm-up then cosine to 10%.

The loop is the post-train recipe's (`tadm.posttrain.train._loop`): seeded global batches
(train_batch per process and step), per-step generators, atomic hash-checked safetensors
checkpoints that a changed objective, data or code refuses to resume (`--restart` moves them
aside), the device of `runtime.device`, DDP under torchrun. Output: ``models/asrd_mdlm`` (save_pretrained)
with the task layout in ``asrd.json``, and ``data/asrd``: the task sets it trained and is
evaluated on (``tasks.jsonl``) with the stage's ``manifest.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch

from tadm import runtime
from tadm.asrd import tasks as T
from tadm.config import ModelConfig, Params
from tadm.forward_process import mask_tokens, sample_times
from tadm.io import atomic_write_json, atomic_write_text
from tadm.losses import mdlm_nelbo, subs_log_probs
from tadm.models import build_model
from tadm.posttrain.train import _loop, cosine_lr
from tadm.registry import METHODS
from tadm.train.trainer import _seed, adamw
from tadm.train.fingerprint import code_fingerprint

MODEL_DIR = Path("models/asrd_mdlm")
DATA_DIR = Path("data/asrd")
CODE = ("asrd/train.py", "asrd/tasks.py", "losses.py", "forward_process.py", "models", "posttrain/train.py",
        "train/checkpoint.py", "train/fingerprint.py")
EPS = 1e-3
# the asrd keys the training reads (the rest configure decoding); train_steps stays in: the
# cosine learning rate ends at it, so more steps change every step after warm-up
TRAIN_KEYS = ("prompt_tokens", "response_tokens", "spelling_max", "spelling_train", "spelling_eval", "eval_examples",
              "mlp_ratio", "train_steps", "train_batch", "lr", "warmup_steps")


def model_config(p: Params) -> ModelConfig:
    """The masked model's sizes: the `model` section with asrd.mlp_ratio."""
    return dataclasses.replace(p.model, mlp_ratio=p.asrd.mlp_ratio)


def task_sets(p: Params, root: Path = Path(".")) -> dict[str, tuple[T.TaskSet, T.TaskSet]]:
    """{task: (train, evaluation)} for both tasks (arithmetic from data/sft, spelling generated)."""
    a = p.asrd
    return {"arithmetic": T.arithmetic_sets(root / "data" / "sft", a.eval_examples, p.sft, p.seed),
            "spelling": T.spelling_sets(a.spelling_train, a.spelling_eval, _seed(p.seed, 0xA5D), a.spelling_max)}


def response_nelbo(model, x: torch.Tensor, region: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """MDLM's NELBO of the response part of x (B, L) (`region` (L,) bool), per response token."""
    schedule, mask_id = METHODS["mdlm"].noise_schedule(EPS), getattr(model, "module", model).mask_id  # DDP: .module
    t = sample_times(x.shape[0], EPS, True, gen, x.device)
    z = mask_tokens(x, schedule.alpha(t), mask_id, gen)
    z = torch.where(region.to(x.device), z, x)  # the prompt is never masked
    nelbo = mdlm_nelbo(subs_log_probs(model(z), z, mask_id), x, z, t, schedule, mask_id)
    return nelbo.mean() / int(region.sum())


def train(p: Params, tokenizer, root: Path = Path("."), log=print, restart: bool = False) -> dict:
    a = p.asrd
    d = runtime.setup(p.runtime)
    sets = task_sets(p, root)
    layout = T.Layout(tokenizer, a.prompt_tokens, a.response_tokens)
    x = torch.cat([layout.encode(tr.prompts, tr.responses) for tr, _ in sets.values()])
    region = layout.region
    cfg = model_config(p)
    torch.manual_seed(_seed(p.seed, 0xA5D))
    with torch.device(d.device):
        model = build_model("mdlm", cfg, len(tokenizer), layout.length).train()
    opt = adamw(model.parameters(), d.device, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    settings = {"asrd": {k: getattr(a, k) for k in TRAIN_KEYS}, "model": dataclasses.asdict(cfg), "seed": p.seed,
                "data": hashlib.sha256(x.numpy().tobytes()).hexdigest(),
                "code": code_fingerprint(CODE)}

    def loss_fn(net, indices, gen):
        return response_nelbo(net, x[indices].to(d.device), region, gen), {}

    history = _loop("asrd_mdlm", model, loss_fn, steps=a.train_steps, batch=a.train_batch, micro=1, n_data=len(x),
                    lr_at=lambda s: cosine_lr(s, a.lr, a.warmup_steps, a.train_steps, 0.1), opt=opt, clip=1.0,
                    run_dir=root / "checkpoints" / "asrd_mdlm", settings=settings, seed=p.seed, log_every=a.log_every,
                    checkpoint_every=a.checkpoint_every, d=d, log=log, restart=restart, compile=p.runtime.compile,
                    command="python -m tadm asrd-model",
                    outputs={"model": (root / MODEL_DIR).parent, "metrics": root / "metrics" / "asrd"})
    summary = {"run": "asrd_mdlm", "steps": a.train_steps, "parameters": sum(q.numel() for q in model.parameters()),
               "sequences": len(x), "layout": {"prompt_tokens": a.prompt_tokens, "response_tokens": a.response_tokens},
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        out = root / MODEL_DIR
        model.eval().save_pretrained(out)
        atomic_write_json(out / "asrd.json", summary["layout"])
        T.dump({f"{name}_{split}": s for name, pair in sets.items() for split, s in zip(("train", "eval"), pair)},
               root / DATA_DIR, dataclasses.asdict(a))
        atomic_write_json(root / "metrics" / "asrd" / "train.json", {**summary, "history": history})
    return summary
