"""One training loop for every method (MDLM, ADLM, TADM, SEDD, AR).

Read it top to bottom: set up (DDP when launched by torchrun), build the method's model,
resume from the newest good checkpoint of this run, then loop: assemble the global batch,
accumulate micro-batch gradients, clip, AdamW step, EMA update, log, evaluate, checkpoint.
At the end the EMA weights are saved as a ``from_pretrained``-style model directory.

Determinism: every random draw of a step comes from generators seeded by (seed, step,
micro-batch index), and the data order from (seed, epoch). Nothing random is carried between
steps, so a run resumed from a checkpoint takes exactly the steps it would have taken, and
N processes compute the same global batch as one process.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from tadm.config import Params
from tadm.data.packing import PackedTokens
from tadm.errors import ConfigError, DataError
from tadm.io import atomic_write_json, atomic_write_text, sha256_file
from tadm.train import checkpoint
from tadm.train.methods import Method, get_method


@dataclass
class RunPaths:
    checkpoints: Path
    model: Path
    metrics: Path  # metrics/train/<name>  (+ .json / .csv / _eval.csv)

    @classmethod
    def for_run(cls, name: str, root: Path = Path(".")) -> "RunPaths":
        return cls(root / "checkpoints" / name, root / "models" / name, root / "metrics" / "train" / name)


# ----------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """Join the process group torchrun describes (gloo on CPU, nccl on GPU), or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world == 1:
        return Dist(0, 1, device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), world, device)


def all_mean(value: float, d: Dist) -> float:
    if d.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=d.device if d.device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.item() / d.world


# ----------------------------------------------------------------------------- data order


def _seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and platforms)."""
    h = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") & ((1 << 63) - 1)


class GlobalBatches:
    """Sample indices of each step's global batch: epoch-wise random permutations of the
    training set, walked in order; batch `step` covers samples [step*G, (step+1)*G)."""

    def __init__(self, n: int, global_batch: int, seed: int):
        self.n, self.g, self.seed = n, global_batch, seed
        self._perm: tuple[int, torch.Tensor] | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(_seed(self.seed, epoch, 0xDA7A))
            self._perm = (epoch, torch.randperm(self.n, generator=gen))
        return self._perm[1]

    def indices(self, step: int) -> list[int]:
        out = []
        for i in range(step * self.g, (step + 1) * self.g):
            out.append(int(self._permutation(i // self.n)[i % self.n]))
        return out


# ----------------------------------------------------------------------------- EMA


class EMA:
    """Exponential moving average of the parameters (kept in fp32)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {n: p.detach().float().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for n, p in model.named_parameters():
            self.shadow[n].mul_(self.decay).add_(p.detach().float(), alpha=1 - self.decay)

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state_dict with EMA values in place of parameters."""
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for n, v in self.shadow.items():
            sd[n] = v.to(sd[n].dtype).clone()
        return sd

    def load(self, sd: dict[str, torch.Tensor]) -> None:
        for n in self.shadow:
            self.shadow[n] = sd[n].float().clone()


# ----------------------------------------------------------------------------- the loop


def learning_rate(step: int, p: Params) -> float:
    """Linear warm-up to train.lr, then constant (MDLM's schedule)."""
    warm = p.train.warmup_steps
    return p.train.lr * min(1.0, (step + 1) / warm) if warm else p.train.lr


# Source files whose change makes a checkpoint belong to another run (a resumed run must
# continue exactly what it started: same objective, same architecture, same loop).
CODE = ("train/trainer.py", "train/methods.py", "losses.py", "forward_process.py", "schedule.py", "models")


def code_hash() -> str:
    root = Path(__file__).resolve().parent.parent
    files = sorted(f for c in CODE for f in ([root / c] if (root / c).is_file() else (root / c).rglob("*.py")))
    return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()


def fingerprint(name: str, p: Params, data_manifest: Path) -> str:
    """Identity of a run: the method, the model and training knobs, the data and the code."""
    payload = json.dumps({"name": name, "seed": p.seed, "model": dataclasses.asdict(p.model),
                          "train": dataclasses.asdict(p.train), "data": sha256_file(data_manifest),
                          "code": code_hash()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@torch.no_grad()
def evaluate(method: Method, model: torch.nn.Module, data: PackedTokens, p: Params, d: Dist) -> float:
    """Validation NELBO (nats per token) on the first eval_sequences sequences, with fixed
    noise, so that numbers are comparable across steps and runs."""
    model.eval()
    n = min(len(data), p.train.eval_sequences)
    total, tokens = 0.0, 0
    for j, start in enumerate(range(0, n, p.train.micro_batch)):
        x = torch.stack([torch.from_numpy(data[i]) for i in range(start, min(n, start + p.train.micro_batch))])
        gen = torch.Generator(device=d.device).manual_seed(_seed(p.seed, 0xE7A1, j))
        nll = method.nelbo(model, x.to(d.device), gen)
        total += nll.sum().item()
        tokens += x.numel()
    model.train()
    return total / tokens


def _write_rows(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def train(name: str, p: Params, data_dir: Path = Path("data/packed"), root: Path = Path("."),
          log=print) -> dict:
    """Train run `name` (one of train.models) to train.steps; resume if interrupted."""
    d = setup_distributed()
    method = get_method(name, p)
    paths = RunPaths.for_run(name, root)
    n_micro = p.train.global_batch // p.train.micro_batch
    if n_micro % d.world:
        raise ConfigError("train.global_batch", f"global_batch/micro_batch = {n_micro} micro-batches must divide among {d.world} processes")

    manifest = data_dir / "manifest.json"
    if not manifest.is_file():
        raise DataError(f"{manifest} is missing: run the data stages first (dvc repro pack)")
    meta = json.loads(manifest.read_text())["counts"]
    train_data, valid_data = PackedTokens(data_dir / "train"), PackedTokens(data_dir / "validation")
    vocab, seq_len = meta["vocab_size"], meta["seq_len"]

    torch.manual_seed(_seed(p.seed, 0x1417))  # identical initial weights on every rank
    model = method.build_model(vocab, seq_len).to(d.device)
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=p.train.lr, betas=tuple(p.train.betas),
                            eps=p.train.eps, weight_decay=p.train.weight_decay)
    ema = EMA(model, p.train.ema)
    fp = fingerprint(name, p, manifest)

    start, history, evals, init_nelbo = 0, [], [], None
    state = checkpoint.load_latest(paths.checkpoints, names, fp, log=log if d.main else (lambda *_: None))
    if state is not None:
        model.load_state_dict(state.model)
        ema.load(state.ema)
        opt.load_state_dict(state.optimizer)
        start, history, evals = state.step, state.extra["history"], state.extra["evals"]
        init_nelbo = state.extra["init_nelbo"]
        if d.main:
            log(f"[{name}] resumed from step {start}")
    if init_nelbo is None:
        init_nelbo = evaluate(method, model, valid_data, p, d)
        evals.append({"step": 0, "val_nelbo": init_nelbo, "val_ppl_bound": math.exp(min(init_nelbo, 50))})

    ddp = torch.nn.parallel.DistributedDataParallel(model) if d.world > 1 else model
    batches = GlobalBatches(len(train_data), p.train.global_batch, p.seed)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if p.train.precision == "bf16" and d.device.type == "cuda" else nullcontext())
    mine = [j for j in range(n_micro) if j % d.world == d.rank]
    tokens_per_step = p.train.global_batch * seq_len
    bar = tqdm(range(start, p.train.steps), initial=start, total=p.train.steps, desc=f"train[{name}]",
               unit="step", disable=not d.main)
    t_last, steps_since = time.perf_counter(), 0
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, p)
        idx = batches.indices(step)
        loss_sum = 0.0
        for k, j in enumerate(mine):
            chunk = idx[j * p.train.micro_batch:(j + 1) * p.train.micro_batch]
            x = torch.stack([torch.from_numpy(train_data[i]) for i in chunk]).to(d.device)
            gen = torch.Generator(device=d.device).manual_seed(_seed(p.seed, step, j))
            sync = ddp.no_sync() if (d.world > 1 and k < len(mine) - 1) else nullcontext()
            with sync:
                with autocast:
                    per_seq = method.loss(ddp, x, gen, progress=step / p.train.steps)
                    loss = per_seq.float().sum() / x.numel()
                (loss / len(mine)).backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)
        steps_since += 1
        done = step + 1

        if done % p.train.log_every == 0 or done == p.train.steps:
            now = time.perf_counter()
            row = {"step": done, "train_loss": all_mean(loss_sum / len(mine), d), "lr": learning_rate(step, p),
                   "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_step * steps_since / (now - t_last)}
            history.append(row)
            t_last, steps_since = now, 0
            bar.set_postfix(loss=f"{row['train_loss']:.3f}")
        if done % p.train.eval_every == 0 or done == p.train.steps:
            # validation on the EMA weights, the ones that get released
            live = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(ema.state_dict(model))
            nelbo = evaluate(method, model, valid_data, p, d)
            model.load_state_dict(live)
            evals.append({"step": done, "val_nelbo": nelbo, "val_ppl_bound": math.exp(min(nelbo, 50))})
        if d.main and (done % p.train.checkpoint_every == 0 or done == p.train.steps):
            extra = {"fingerprint": fp, "history": history, "evals": evals, "init_nelbo": init_nelbo}
            # keep two while training (a kill mid-write still leaves one); at the end only the last
            state = checkpoint.TrainState(done, model.state_dict(), ema.state_dict(model), opt.state_dict(), extra)
            checkpoint.save(paths.checkpoints, state, names, keep=1 if done == p.train.steps else 2)
            _write_rows(paths.metrics.with_suffix(".csv"), history)
            _write_rows(paths.metrics.parent / f"{name}_eval.csv", evals)

    summary = {}
    if d.main:
        model.load_state_dict(ema.state_dict(model))
        model.save_pretrained(paths.model)
        speeds = [r["tokens_per_s"] for r in history[1:]] or [r["tokens_per_s"] for r in history]
        summary = {
            "run": name, "model_type": method.model_type, "steps": p.train.steps,
            "parameters": sum(t.numel() for t in model.parameters()),
            "val_nelbo_init": init_nelbo, "val_nelbo": evals[-1]["val_nelbo"],
            "val_ppl_bound": evals[-1]["val_ppl_bound"],
            "train_tokens_per_s": sorted(speeds)[len(speeds) // 2] if speeds else None,
        }
        atomic_write_json(paths.metrics.with_suffix(".json"), summary)
        _write_rows(paths.metrics.with_suffix(".csv"), history)
        _write_rows(paths.metrics.parent / f"{name}_eval.csv", evals)
    if d.world > 1:
        dist.barrier()
    return summary
