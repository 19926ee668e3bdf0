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

Fusion replicates (``posttrain.replicates``): the fusion and the control also train with seeds
posttrain.seed + 1, ... (``replicate`` k > 0 of ``train_fusion``; every draw of the run --
initialisation, data order, per-step draws -- follows its seed), on the same frozen base; the run
at posttrain.seed stays the tables' main run at its paths, a replicate lives under a
``replicates/`` subdirectory (:class:`FusionRun`): ``checkpoints/replicates/dg_posttrain-s1``,
``models/replicates/dg_tadm-s1``, ``metrics/posttrain/replicates/dg_posttrain-s1.json`` and
``..._eval.csv``. Table 1 evaluates each replicate's fusion on the same base.

Validation curve: every ``posttrain.val_every`` steps (and at step 0 and the last step) the
fusion's objective -- the same CE + KD of on-policy states, the control's for the control -- is
evaluated without gradients on ``posttrain.val_canvases`` fixed canvases of the SFT validation
split, in batches whose draws come from generators fixed by (the global seed, batch): the same
canvases, noise, cache ages and rollout draws at every evaluation and in every run, so the points
of a curve (and the curves of the replicates) differ only by the fusion's weights. Written to
``metrics/posttrain/<run>_eval.csv`` (step, val_loss, val_ce, val_kd, val_loss_se: the se over
the validation batches, val_change / val_change_se: the change since the previous evaluation and
its se paired over the batches -- the noise that says whether the curve still falls) and kept in
the checkpoints, so a resumed run's curve is the uninterrupted one's.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from tadm import memory_estimate, runtime
from tadm.config import Params
from tadm.data import chat
from tadm.errors import ConfigError
from tadm.io import atomic_write_json, atomic_write_text, sha256_file
from tadm.posttrain import model as dgm
from tadm.posttrain.data import SftCanvases
from tadm.posttrain.objective import Rollout, base_loss, posttrain_loss
from tadm.runtime import Dist, all_mean
from tadm.train import checkpoint
from tadm.train.divergence import FiniteWatch
from tadm.train.fingerprint import code_fingerprint
from tadm.train.trainer import REPLICATES, GlobalBatches, _seed, adamw, hold_run, replicate_name, resume_state, seeds_after, wrap

SFT_DIR = Path("data/sft")
# code a checkpoint depends on (a change refuses to resume it): the base's run and the fusion's
CODE = {"dg_base": ("posttrain/data.py", "posttrain/objective.py", "posttrain/model.py", "posttrain/train.py",
                    "train/checkpoint.py", "train/fingerprint.py")}
CODE["dg_posttrain"] = CODE["dg_base"] + ("posttrain/backbone.py", "posttrain/fusion.py", "posttrain/anchored.py")
CODE["dg_posttrain_fresh"] = CODE["dg_posttrain"]
# Settings that define each run's objective (recorded in its checkpoints; a change is refused).
# The steps stay in: both runs decay the learning rate on a cosine that ends at their `steps`,
# so more steps change the learning rate of every step after warm-up -- a run cannot be
# extended, only restarted. What is left out: logging and checkpoint cadence, Table 1's
# evaluation, and (for the fusion) the base section, whose weights are fingerprinted themselves;
# the replicate count (a run is the same whichever others train) and the validation cadence and
# size (they read the weights, never change them).
BASE_KEYS = ("seed", "base", "shared_layers", "anchor_layers", "denoiser_layers", "canvas_length", "max_context_tokens",
             "self_cond_p", "grad_clip")
FUSION_IGNORES = ("base", "checkpoint_every", "log_every", "refresh_every", "tasks", "task_sources", "eval_examples",
                  "eval_batch_size", "seeds", "max_new_tokens", "cache_methods", "feature_cache_share", "cache_seeds",
                  "replicates", "replicate_refresh_every", "val_every", "val_canvases")
VAL_SEED = 0x7A11D  # the validation canvases' choice and draws: (global seed, VAL_SEED, ...), never the run's seed
METRICS_DIR = Path("metrics/posttrain")


@dataclass(frozen=True)
class FusionRun:
    """One training run of TADM:Post-train's fusion (`fresh` False) or of Table 1's fresh-anchor
    control (`fresh` True): the main run (`replicate` 0, seed posttrain.seed) or replicate k
    (seed posttrain.seed + k), and where it lives under `root`."""

    fresh: bool
    replicate: int
    seed: int
    root: Path = Path(".")

    @property
    def kind(self) -> str:
        """The recipe: dg_posttrain or dg_posttrain_fresh (its code and settings)."""
        return "dg_posttrain_fresh" if self.fresh else "dg_posttrain"

    @property
    def name(self) -> str:
        """The run's name: the kind, a replicate's with its seed (``dg_posttrain-s1``)."""
        return replicate_name(self.kind, self.seed) if self.replicate else self.kind

    def _under(self, folder: Path, name: str) -> Path:
        return self.root / folder / REPLICATES / replicate_name(name, self.seed) if self.replicate else self.root / folder / name

    @property
    def checkpoints(self) -> Path:
        return self._under(Path("checkpoints"), self.kind)

    @property
    def model(self) -> Path:
        """The saved fusion: models/dg_tadm (dg_fresh), a replicate's models/replicates/dg_tadm-s<seed>."""
        main = dgm.FRESH_DIR if self.fresh else dgm.TADM_DIR
        return self._under(main.parent, main.name)

    @property
    def metrics(self) -> Path:
        return self._under(METRICS_DIR, self.kind).with_suffix(".json")

    @property
    def curve(self) -> Path:
        """The validation curve (CSV)."""
        return self.metrics.with_name(self.metrics.stem + "_eval.csv")

    @property
    def command(self) -> str:
        return ("python -m tadm dg-posttrain" + (" --fresh-anchor" if self.fresh else "")
                + (f" --replicate {self.replicate}" if self.replicate else ""))


def replicate_seeds(p: Params) -> list[int]:
    """The fusion replicates' seeds beyond the main run's (posttrain.replicates - 1 of them)."""
    return seeds_after(p.posttrain.seed, p.posttrain.replicates)


def fusion_run(p: Params, fresh: bool = False, replicate: int = 0, root: Path = Path(".")) -> FusionRun:
    """Run `replicate` (0: the main run) of the fusion or the control; ConfigError beyond
    posttrain.replicates."""
    if not 0 <= replicate < p.posttrain.replicates:
        raise ConfigError("posttrain.replicates", f"is {p.posttrain.replicates}: there is no fusion replicate {replicate} "
                          f"(1 .. {p.posttrain.replicates - 1})" if p.posttrain.replicates > 1 else
                          f"is 1: there is no fusion replicate {replicate} (raise posttrain.replicates)")
    return FusionRun(fresh, replicate, p.posttrain.seed + replicate, Path(root))


def fusion_runs(p: Params, fresh: bool = False, root: Path = Path(".")) -> list[FusionRun]:
    """Every run of the fusion (or the control): the main run first, then each replicate."""
    return [fusion_run(p, fresh, k, root) for k in range(p.posttrain.replicates)]


class Validation:
    """The held-out loss of a training objective on fixed validation examples with fixed draws.

    `loss_fn(indices, gen)` -> (loss, logs with "ce" and "kd") is evaluated without gradients on
    `n` examples of `n_data` (a permutation seeded by `seed`: the same for every run of that seed)
    in batches of `batch`; batch j draws from a generator seeded by (seed, j) on `device`, so every
    evaluation sees the same examples and draws. Under torchrun the batches are split over the
    processes and gathered. `evals` holds the records so far (restored from a checkpoint)."""

    def __init__(self, loss_fn: Callable, n_data: int, n: int, batch: int, seed: int, every: int, d: Dist):
        order = torch.randperm(n_data, generator=torch.Generator(runtime.CPU).manual_seed(_seed(seed, VAL_SEED)),
                               device=runtime.CPU)[: min(n, n_data)].tolist()
        self.batches = [order[i:i + batch] for i in range(0, len(order), batch)]
        self.loss_fn, self.seed, self.every, self.d = loss_fn, seed, every, d
        self.evals: list[dict] = []

    def due(self, step: int, steps: int) -> bool:
        return step % self.every == 0 or step == steps

    @torch.no_grad()
    def evaluate(self, step: int) -> dict:
        d, mine, t0 = self.d, [], time.perf_counter()
        for j in runtime.shard(len(self.batches), d):
            gen = torch.Generator(device=d.device).manual_seed(_seed(self.seed, VAL_SEED, j))
            loss, logs = self.loss_fn(self.batches[j], gen)
            mine.append((float(loss), float(logs["ce"]), float(logs["kd"]), len(self.batches[j])))
        rows = runtime.gather(mine, len(self.batches), d)
        n = sum(r[3] for r in rows)
        mean = [sum(r[i] * r[3] for r in rows) / n for i in range(3)]
        losses = [r[0] for r in rows]
        # the change since the previous evaluation, and its se paired over the batches (the same
        # canvases and draws: what differs is the weights); the unpaired se is the batches' spread
        before = self.evals[-1]["val_batch_losses"] if self.evals else None
        diffs = [a - b for a, b in zip(losses, before)] if before is not None and len(before) == len(losses) else None
        record = {"step": step, "val_loss": mean[0], "val_ce": mean[1], "val_kd": mean[2], "val_loss_se": _se(losses),
                  "val_change": sum(x * r[3] for x, r in zip(diffs, rows)) / n if diffs else None,
                  "val_change_se": _se(diffs) if diffs else None,
                  "val_examples": n, "val_seconds": round(time.perf_counter() - t0, 3),
                  "val_batch_losses": losses}  # per batch: paired comparisons of any two steps
        self.evals.append(record)
        return record


def _se(values: list[float]) -> float | None:
    """The standard error of the mean of `values` (None with fewer than 2)."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))


def write_curve(path: Path, evals: list[dict]) -> None:
    """The validation curve as CSV (one row per evaluation)."""
    buf = io.StringIO()
    fields = ["step", "val_loss", "val_ce", "val_kd", "val_loss_se", "val_change", "val_change_se", "val_examples"]
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(evals)
    atomic_write_text(path, buf.getvalue())


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
            "code": code_fingerprint(CODE[kind])}


def micro_batches(indices: list[int], batch: int, micro: int, d: Dist) -> list[tuple[int, list[int]]]:
    """This process's share of a step's global batch `indices` (batch * micro * world of them):
    its m-th micro-batch is global micro-batch j = m * world + rank, examples
    [j*batch, (j+1)*batch). Over all processes: every j once, whatever the world size."""
    return [(j, indices[j * batch:(j + 1) * batch]) for j in (m * d.world + d.rank for m in range(micro))]


def _loop(name: str, module: torch.nn.Module, loss_fn: Callable, *, steps: int, batch: int, micro: int,
          n_data: int, lr_at: Callable[[int], float], opt: torch.optim.Optimizer, clip: float, run_dir: Path,
          settings: dict[str, Any], seed: int, log_every: int, checkpoint_every: int, d: Dist, log=print,
          restart: bool = False, compile: bool = False, command: str | None = None,
          validation: Validation | None = None, outputs: dict[str, Path] | None = None) -> list[dict]:
    """Optimise `module`'s trainable parameters; `loss_fn(net, indices, gen)` -> (loss, logs).

    Each process does `micro` micro-batches of `batch` examples per step: global micro-batch
    j = m * world + rank (this process's m-th) takes examples [j*batch, (j+1)*batch) of the
    step's global batch (batch * micro * world indices of the seeded data order) and draws
    from a generator seeded by (seed, step, j). `settings` define the run (a checkpoint of other
    settings is refused); `restart` moves old checkpoints aside; `compile` -> torch.compile of
    the trained module's forward; `command` is named in errors as the one to rerun. The run
    holds `run_dir`'s lock throughout (a second run on it is refused, naming this one).
    `validation`: evaluated at the start, every `validation.every` steps and at the last step
    (before that step's checkpoint, which keeps its records: `validation.evals`)."""
    with hold_run(run_dir, d, command, outputs):  # `outputs`: where the caller saves the result (probed first)
        return _locked_loop(name, module, loss_fn, steps=steps, batch=batch, micro=micro, n_data=n_data, lr_at=lr_at,
                            opt=opt, clip=clip, run_dir=run_dir, settings=settings, seed=seed, log_every=log_every,
                            checkpoint_every=checkpoint_every, d=d, log=log, restart=restart, compile=compile,
                            command=command, validation=validation)


def _locked_loop(name: str, module: torch.nn.Module, loss_fn: Callable, *, steps: int, batch: int, micro: int,
                 n_data: int, lr_at: Callable[[int], float], opt: torch.optim.Optimizer, clip: float, run_dir: Path,
                 settings: dict[str, Any], seed: int, log_every: int, checkpoint_every: int, d: Dist, log=print,
                 restart: bool = False, compile: bool = False, command: str | None = None,
                 validation: Validation | None = None) -> list[dict]:
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
        if validation is not None:
            validation.evals = list(state.extra.get("evals", []))
        quiet(f"[{name}] resumed from step {start}")
        del state
    if validation is not None and not validation.evals:
        record = validation.evaluate(start)
        quiet(f"[{name}] step {start}: validation loss {record['val_loss']:.4f}")
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
        if validation is not None and validation.due(done, steps):
            record = validation.evaluate(done)
            bar.set_postfix({**({"loss": f"{history[-1]['loss']:.3f}"} if history else {}), "val": f"{record['val_loss']:.3f}"})
        if d.main and saved:
            weights = {n: p.detach().clone() for n, p in params.items()}
            extra = {"fingerprint": fp, "history": history, "settings": settings}
            if validation is not None:
                extra["evals"] = validation.evals
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
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
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
                    command="python -m tadm dg-base", outputs={"model": root / "models", "metrics": root / METRICS_DIR})
    summary = {"run": "dg_base", "steps": b.steps, "parameters": sum(q.numel() for q in trainable),
               "decoder_layers": model.config.text_config.num_hidden_layers,
               "final_loss": history[-1]["loss"] if history else None}
    if d.main:
        model.eval().save_pretrained(root / dgm.BASE_DIR)
        tokenizer.save_pretrained(root / dgm.BASE_DIR)
        atomic_write_json(root / "metrics" / "posttrain" / "dg_base.json", {**summary, "history": history})
    return summary


def train_fusion(p: Params, sft_dir: Path = SFT_DIR, root: Path = Path("."), log=print,
                 restart: bool = False, fresh: bool = False, replicate: int = 0) -> dict:
    """TADM:Post-train: train the fusion of a frozen DiffusionGemma (posttrain section).

    `fresh`: Table 1's control instead -- the same recipe (data, steps, seed, optimiser, CE + KD,
    rollouts) with the anchor recomputed at every step (``objective.posttrain_loss(fresh=True)``),
    run ``dg_posttrain_fresh``, saved to ``models/dg_fresh``.
    `replicate` k > 0: the run's k-th fusion replicate, the same recipe with seed posttrain.seed + k
    under ``replicates/`` (:class:`FusionRun`); k must be below posttrain.replicates.
    The validation curve (posttrain.val_every, val_canvases) is written beside the metrics."""
    run = fusion_run(p, fresh, replicate, root)
    if replicate:
        p = dataclasses.replace(p, posttrain=dataclasses.replace(p.posttrain, seed=run.seed))
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from tadm.data.tokenizer import load_tokenizer

    d = runtime.setup(p.runtime)
    pt = p.posttrain
    source = dgm.base_source(p, root)
    base = dgm.load_base(source, pt.precision, d.device, local=pt.base_model == "local")
    tokenizer = load_tokenizer(source)
    pad, _ = _pad_and_eos(tokenizer)
    data = SftCanvases(sft_dir, "train", pt.canvas_length, pt.max_context_tokens, pad)
    held_out = SftCanvases(sft_dir, "validation", pt.canvas_length, pt.max_context_tokens, pad)
    torch.manual_seed(_seed(pt.seed, 0xF0))
    tadm = dgm.build_tadm(base, p, fresh=fresh)
    fusion = tadm.fusion.float().train()
    if d.main:
        log(f"{'fresh-anchor control' if fresh else 'fusion'} {run.name} (seed {pt.seed}): {fusion.num_parameters:,} "
            f"trainable parameters (rank {pt.fusion_rank}, split {tadm.split.split})")
    opt = adamw(fusion.parameters(), d.device, lr=pt.lr, betas=tuple(pt.betas), eps=1e-8, weight_decay=pt.weight_decay)
    rollout = Rollout(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), pt.canvas_length,
                      base.config.text_config.vocab_size)
    settings = _settings(run.kind, p, sft_dir, {"base": source, "base_hash": _base_hash(source)})
    autocast = runtime.autocast(d.device, pt.precision)

    def loss_fn(net, indices, gen, canvases=data):
        with autocast:
            return posttrain_loss(tadm.split, net, canvases.batch(indices).to(d.device), gen, pt, rollout, fresh=fresh)

    # the held-out loss of the same objective, on the unwrapped fusion (no DDP hooks), its draws
    # fixed by the global seed: the same in every run and at every evaluation
    validation = Validation(lambda indices, gen: loss_fn(fusion, indices, gen, held_out), len(held_out),
                            pt.val_canvases, pt.batch_size, p.seed, pt.val_every, d)
    history = _loop(run.name, fusion, loss_fn, steps=pt.steps, batch=pt.batch_size, micro=pt.grad_accum,
                    n_data=len(data), lr_at=lambda s: cosine_lr(s, pt.lr, pt.warmup_steps, pt.steps, pt.min_lr_ratio),
                    opt=opt, clip=pt.grad_clip, run_dir=run.checkpoints, settings=settings,
                    seed=pt.seed, log_every=pt.log_every, checkpoint_every=pt.checkpoint_every, d=d, log=log,
                    restart=restart, compile=p.runtime.compile, command=run.command, validation=validation,
                    outputs={"model": run.model.parent, "metrics": run.metrics.parent})
    evals = validation.evals
    summary = {"run": run.name, "kind": run.kind, "replicate": run.replicate, "seed": run.seed, "steps": pt.steps,
               "fusion_parameters": fusion.num_parameters, "split": list(tadm.split.split), "base_model": source,
               "final_loss": history[-1]["loss"] if history else None,
               "final_val_loss": evals[-1]["val_loss"] if evals else None}
    if d.main:
        dgm.save_fusion(tadm, run.model, source, {"steps": pt.steps, "seed": run.seed, "replicate": run.replicate})
        atomic_write_json(run.metrics, {**summary, "history": history, "evals": evals})
        write_curve(run.curve, evals)
    return summary


def _base_hash(source: str) -> str:
    """Identity of a local base checkpoint (its weight files), or the hub id itself."""
    path = Path(source)
    if not path.is_dir():
        return source
    return hashlib.sha256("".join(sha256_file(f) for f in sorted(path.glob("*.safetensors"))).encode()).hexdigest()[:16]
