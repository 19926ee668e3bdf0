"""One training loop for every method (MDLM, ADLM, TADM, SEDD, AR).

Read it top to bottom: set up (``tadm.runtime``: the device of ``runtime.device``, DDP when
launched by torchrun), build the method's model, resume from the newest good checkpoint of
this run, then loop: assemble the global batch, accumulate micro-batch gradients, clip, AdamW
step, EMA update, log, evaluate, checkpoint. At the end the EMA weights are saved as a
``from_pretrained``-style model directory.

Determinism: every random draw of a step comes from generators seeded by (seed, step,
micro-batch index) -- dropout's too: it draws from the global generators, which are reseeded
that way per micro-batch when model.dropout > 0 -- and the data order from (seed, epoch).
Nothing random is carried between steps (there is no RNG state to checkpoint), so a run
resumed from a checkpoint takes exactly the steps it would have taken, and N processes
compute the same global batch as one process.

Resuming: a checkpoint records the settings that define the objective (:func:`run_settings`);
other settings are refused with a one-line error naming the changed keys, never deleted
(``tadm train NAME --restart`` moves them aside). ``train.steps`` is not one of them (except
for ADLM, whose anchor weight ramps over a fraction of it): the learning rate is constant after
warm-up, so a finished run extended to more steps continues exactly as a longer run would.

Speed on a GPU: each step's tokens in pinned memory, copied without blocking while the step
before computes (:func:`step_tokens`); AdamW's fused kernel, a multi-tensor EMA update, one host sync per logged step
(the loss is accumulated on the device), ``runtime.compile`` -> ``torch.compile`` of each
transformer block and TADM's fusion (:func:`compile_blocks`) and of each readout chunk (head,
cast, cross-entropy and their backward: ``Method.compile_heads``), bf16 autocast
(``train.precision``) with the residual stream in fp32 or bf16 (``train.residual``). The CPU path keeps torch's default
AdamW so that CPU trajectories do not depend on these.

Why one module of ~500 lines: the loop is read top to bottom in one place, and this file's syntax
is part of every pretraining run's code fingerprint (``CODE``), so splitting it would make every
finished checkpoint stale and retrain every model.
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

import torch
from tqdm import tqdm

from tadm import memory_estimate, runtime
from tadm.config import Params
from tadm.data.packing import PACK_HINT, PackedTokens
from tadm.errors import ConfigError, TadmError
from tadm.io import read_manifest, atomic_write_json, atomic_write_text, require_writable, sha256_file
from tadm.runtime import Dist, all_mean  # noqa: F401 - Dist / all_mean: importable from here as before
from tadm.train import checkpoint
from tadm.train.card import CARD_FILE, model_card
from tadm.methods import Method, get_method
from tadm.models.dit import set_autocast_residual
from tadm.train.divergence import FiniteWatch, check_excess, check_value
from tadm.train.fingerprint import code_fingerprint


@dataclass
class RunPaths:
    checkpoints: Path
    model: Path
    metrics: Path  # metrics/train/<name>  (+ .json / .csv / _eval.csv)

    @classmethod
    def for_run(cls, name: str, root: Path = Path("."), replicate: int = 0, seed: int = 0) -> "RunPaths":
        """Run `name`'s directories; a training replicate (`replicate` > 0, trained with `seed`)
        lives under a `replicates/<name>-s<seed>` subdirectory of each."""
        if replicate:
            tail = Path(REPLICATES) / replicate_name(name, seed)
            return cls(root / "checkpoints" / tail, root / "models" / tail, root / "metrics" / "train" / tail)
        return cls(root / "checkpoints" / name, root / "models" / name, root / "metrics" / "train" / name)


REPLICATES = "replicates"  # checkpoints/, models/ and metrics/train/ subdirectory of the training replicates


def replicate_name(name: str, seed: int) -> str:
    """A training replicate's name: the run and its seed (``tadm-s1``)."""
    return f"{name}-s{seed}"


def seeds_after(seed: int, replicates: int) -> list[int]:
    """The seeds of the training replicates beyond the tables' run at `seed`: seed + 1, ...,
    seed + replicates - 1 (``train.replicates``, ``posttrain.replicates``)."""
    return [seed + i for i in range(1, replicates)]


def replicate_seeds(p: Params) -> list[int]:
    """The seeds of the training replicates beyond the tables' run (train.replicates - 1 of them)."""
    return seeds_after(p.seed, p.train.replicates)


# ----------------------------------------------------------------------------- devices


def adamw(params, device: torch.device, **kwargs) -> torch.optim.AdamW:
    """AdamW: the fused kernel on a GPU; torch's default implementation on the CPU (so CPU
    trajectories stay what they were)."""
    on_gpu = torch.device(device).type != runtime.CPU.type
    return torch.optim.AdamW(params, **kwargs, **({"fused": True} if on_gpu else {}))


# runtime.compile: the backend of torch.compile (the tests and `gpu_check --smoke` set "aot_eager":
# the same capture, guards and autograd graphs, no C++ / Triton code generation)
COMPILE_BACKEND = "inductor"


def compiled_pieces(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The fixed-shape pieces ``runtime.compile`` compiles: every DiT block (MDLM / SEDD / AR's
    ``blocks``, ADLM and TADM's ``anchor_blocks`` and ``denoiser_blocks``) and TADM's fusion.

    Not the whole model: its readouts gather a fixed number of rows (tadm.losses.Readout's
    capacity), but that number differs between training and validation, between TADM's two
    readouts (z_t and the staler z_t') and between ADLM's (masked rows, every row), and TADM's
    two forwards (training's stale pair, validation's fresh anchor) and two heads then reach
    the recompile limit and fall back to eager. A block sees (B, L, d) in,
    (B, L, d) out at every step of a run, so its graph is traced once per grad mode and batch
    size (training's micro-batch; validation's, under no_grad) and every block of a model
    shares it (same code, same shapes; parameters are graph inputs, not constants)."""
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from tadm.models.dit import DiTBlock
    # lazy: kept in place: this file's syntax tree is the training fingerprint (a move forces retraining)
    from tadm.models.fusion import Fusion

    return [m for m in model.modules() if isinstance(m, (DiTBlock, Fusion))]


def compile_blocks(model: torch.nn.Module, backend=None) -> list[torch.nn.Module]:
    """Compile the ``forward`` of each of :func:`compiled_pieces` in place (full graphs, static
    shapes); parameter and state_dict names stay the module's own (no ``_orig_mod.``).

    The forward, not ``nn.Module.compile`` (which compiles ``Module._call_impl``): torch.compile
    caches graphs per code object, and ``_call_impl`` is one code object shared by every module
    class, so blocks and the fusion (and, in one process, other models' blocks) would share one
    cache and its recompile limit (8 entries); ``DiTBlock.forward`` and ``Fusion.forward`` each
    have their own. Already compiled pieces are left as they are."""
    pieces = compiled_pieces(model)
    for m in pieces:
        if "forward" not in vars(m):
            m.forward = torch.compile(m.forward, backend=backend or COMPILE_BACKEND, fullgraph=True, dynamic=False)
    return pieces


def wrap(model: torch.nn.Module, d: Dist, compile: bool = False) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ddp, net): `model` in DDP when there are several processes, and the module the training
    forward calls. `compile` compiles the model's blocks in place (:func:`compile_blocks`), not
    the model; a module with none of them (the post-train loop's, tadm.posttrain.train) is
    compiled whole as before (``net`` = ``torch.compile(ddp)``). Weights are read and saved
    through `model` itself, so state_dict names carry no DDP / compile prefix."""
    ddp = model
    whole = compile and not compile_blocks(model)
    if d.world > 1:
        ids = [d.device.index] if d.device.type != runtime.CPU.type else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return ddp, (torch.compile(ddp, backend=COMPILE_BACKEND) if whole else ddp)


def hold_run(run_dir: Path, d: Dist, command: str | None = None, outputs: dict[str, Path] | None = None):
    """The lock on a run's checkpoint directory for the whole run, shared by every training
    loop (``with hold_run(...)``): the main process takes it (:class:`checkpoint.RunLock`; a
    second run on the directory is refused with a one-line :class:`checkpoint.RunLocked`
    naming the holder); the other processes of a torchrun job are covered by it. Before that,
    the main process probes the checkpoint directory and the run's `outputs` ({what: directory}:
    where its model and metrics go) for writing: a read-only or impossible place is one line
    before any step, not a traceback after the run (:func:`tadm.io.require_writable`)."""
    if d.main:
        require_writable({"checkpoints": run_dir, **(outputs or {})}, command or "the run")
    return checkpoint.RunLock(run_dir, command) if d.main else nullcontext()


def resume_state(run_dir: Path, names: list[str], settings: dict, *, steps: int, steps_key: str, restart: bool,
                 hint: str, d: Dist, log=print, expected: dict | None = None) -> checkpoint.TrainState | None:
    """The checkpoint a run continues from (None: start fresh), shared by every training loop.

    ``--restart`` (`restart`): the main process first moves the run's checkpoints aside (never
    deletes them) while the others wait. A checkpoint of other settings is refused
    (:class:`checkpoint.SettingsChanged`, naming `hint`, the command that starts over), and so
    is one beyond `steps`, and one whose tensors are not the `expected` ones (the model's state
    dict or trained subset: names, shapes, dtypes)."""
    if restart:
        if d.main:
            moved = checkpoint.move_aside(run_dir)
            log(f"{run_dir}: moved aside to {moved}, starting fresh" if moved else f"{run_dir}: nothing to move aside")
        runtime.barrier(d)
    if d.main:  # the lock is held: what a killed save left behind is stale
        cleared = checkpoint.remove_stale_temporaries(run_dir)
        if cleared:
            log(f"{run_dir}: cleared what an interrupted save left: {', '.join(cleared)}")
    runtime.barrier(d)
    state = checkpoint.load_latest(run_dir, names, settings, log=log, restart=hint)
    if state is not None and expected is not None:
        checkpoint.check_tensors(checkpoint.step_dir(run_dir, state.step), expected, state)
    if state is not None and state.step > steps:
        raise TadmError(f"the newest checkpoint is at step {state.step}, beyond {steps_key} = {steps}: raise "
                        f"{steps_key} to continue it, or start over with {hint}")
    return state


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
            gen = torch.Generator(runtime.CPU).manual_seed(_seed(self.seed, epoch, 0xDA7A))
            self._perm = (epoch, torch.randperm(self.n, generator=gen, device=runtime.CPU))  # the data order lives on the host
        return self._perm[1]

    def indices(self, step: int) -> list[int]:
        out = []
        for i in range(step * self.g, (step + 1) * self.g):
            out.append(int(self._permutation(i // self.n)[i % self.n]))
        return out


def step_tokens(data: PackedTokens, idx: list[int], mine: list[int], micro: int,
                device: torch.device) -> tuple[torch.Tensor, ...]:
    """This process's micro-batches of a step, (micro, L) each on `device`: batch j of `mine`
    is samples idx[j*micro:(j+1)*micro]. On a GPU the tokens are stacked into pinned host memory
    and moved by one non-blocking copy, so the host never waits on the device here (the loop
    issues step s+1's copy while step s computes); on the CPU the split is of the stack itself."""
    rows = [i for j in mine for i in idx[j * micro:(j + 1) * micro]]
    return runtime.to_device(torch.stack([torch.from_numpy(data[i]) for i in rows]), device).split(micro)


# ----------------------------------------------------------------------------- EMA


class EMA:
    """Exponential moving average of the parameters (kept in fp32)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {n: p.detach().float().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """shadow <- decay * shadow + (1 - decay) * param, as two multi-tensor ops (one kernel
        launch each on a GPU); on the CPU the same per-tensor mul_ / add_ as a loop, bit for bit."""
        named = list(model.named_parameters())
        shadows = [self.shadow[n] for n, _ in named]
        params = [p.detach().float() for _, p in named]
        torch._foreach_mul_(shadows, self.decay)
        torch._foreach_add_(shadows, params, alpha=1 - self.decay)

    def state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's state_dict with EMA values in place of parameters."""
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for n, v in self.shadow.items():
            sd[n] = v.to(sd[n].dtype).clone()
        return sd

    def load(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy saved EMA values (on the host) into the shadow, which stays on the model's device."""
        for n, v in self.shadow.items():
            v.copy_(sd[n])


# ----------------------------------------------------------------------------- the loop


def learning_rate(step: int, p: Params) -> float:
    """Linear warm-up to train.lr, then constant (train.schedule "constant", MDLM's schedule) or
    a cosine decay to train.min_lr_ratio x train.lr at the last step ("cosine": short runs end
    lower with it; the default profile's)."""
    warm, peak = p.train.warmup_steps, p.train.lr
    if warm and step < warm:
        return peak * (step + 1) / warm
    if p.train.schedule == "constant":
        return peak
    frac = min(1.0, (step - warm) / max(1, p.train.steps - warm))
    r = p.train.min_lr_ratio
    return peak * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * frac)))


# Source files whose change makes a checkpoint belong to another run (a resumed run must
# continue exactly what it started: same objective, same architecture, same loop).
CODE = ("train/trainer.py", "train/fingerprint.py", "methods", "losses.py", "forward_process.py", "schedule.py",
        "models")


def code_hash() -> str:
    """The fingerprint of CODE (`tadm.train.fingerprint`: the programs, not their text)."""
    return code_fingerprint(CODE)


# train keys that do not change what is optimised: a checkpoint resumes across changes of them.
# train.steps: the warm-up schedule is constant after warm-up, so extending a run is exact --
# except for the methods whose objective reads it (Method.steps_in_objective). (train.precision stays: bf16 autocast
# changes the trajectory; the runtime section -- device, precision of inference, tf32, nproc,
# compile -- is not part of a run's identity at all.)
NOT_FINGERPRINTED = ("models", "steps", "log_every", "eval_every", "eval_sequences", "checkpoint_every", "replicates",
                     "replicate_models")  # which runs train, not how one does


def run_settings(name: str, p: Params, data_manifest: Path, method: Method | None = None) -> dict:
    """What defines a run's trajectory: the method, the model, the training knobs that change
    the objective, the seed, the data and the code (recorded in every checkpoint)."""
    method = method if method is not None else get_method(name, p)
    steps_matter = method.steps_in_objective or p.train.schedule != "constant"  # a decay ends at train.steps
    train = {k: v for k, v in dataclasses.asdict(p.train).items()
             if k not in NOT_FINGERPRINTED or (k == "steps" and steps_matter)}
    return {"name": name, "seed": p.seed, "model": dataclasses.asdict(p.model), "train": train,
            "data": sha256_file(data_manifest), "code": code_hash()}


def fingerprint(name: str, p: Params, data_manifest: Path) -> str:
    """Identity of a run (the hash of :func:`run_settings`)."""
    return checkpoint.fingerprint(run_settings(name, p, data_manifest))


@torch.no_grad()
def evaluate(method: Method, model: torch.nn.Module, data: PackedTokens, p: Params, d: Dist) -> float:
    """Validation NELBO (nats per token) on the first eval_sequences sequences, with fixed
    noise, so that numbers are comparable across steps and runs."""
    model.eval()
    n = min(len(data), p.train.eval_sequences)
    total, tokens = torch.zeros((), dtype=torch.float64, device=d.device), 0  # summed on the device
    for j, start in enumerate(range(0, n, p.train.micro_batch)):
        x = torch.stack([torch.from_numpy(data[i]) for i in range(start, min(n, start + p.train.micro_batch))])
        gen = torch.Generator(device=d.device).manual_seed(_seed(p.seed, 0xE7A1, j))
        nll = method.nelbo(model, runtime.to_device(x, d.device), gen)
        total += nll.sum().double()
        tokens += x.numel()
    model.train()
    excess = method.take_excess()
    if excess is None:
        return float(total) / tokens
    total, excess = torch.stack([total, excess.double()]).tolist()  # one host read
    check_excess(method.name, "in validation", excess)
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
          log=print, restart: bool = False, replicate: int = 0) -> dict:
    """Train run `name` (one of train.models) to train.steps; resume if interrupted.

    `replicate` k > 0: train the run's k-th training replicate instead, the same recipe with seed
    `seed + k` (every draw: initial weights, data order, noise), under
    ``checkpoints/replicates/<name>-s<seed + k>`` (and models/, metrics/train/ likewise); k must
    be below train.replicates.
    `restart`: move the run's checkpoints aside (``checkpoints/<name>.old-<step>``) and start
    fresh instead of resuming. The run holds its checkpoint directory's lock throughout
    (:func:`hold_run`): a second run on it is refused."""
    get_method(name, p)  # an unknown run name fails before anything else is read
    if replicate:
        if not 0 < replicate < p.train.replicates:
            raise ConfigError("train.replicates", f"is {p.train.replicates}: there is no training replicate {replicate} "
                              f"(1 .. {p.train.replicates - 1})")
        p = dataclasses.replace(p, seed=p.seed + replicate)
    paths = RunPaths.for_run(name, root, replicate, p.seed)
    d = runtime.setup(p.runtime)
    # the data is opened, and checked against its manifest, before the run directory is touched
    # (nothing is written, not even the lock, for data that does not match)
    meta = read_manifest(data_dir, "pack", PACK_HINT)["counts"]
    data = PackedTokens(data_dir / "train"), PackedTokens(data_dir / "validation")
    # before anything is allocated (or the run directory touched): will it fit this machine?
    checkpoint_heads = memory_estimate.require_training(name, p)  # False: the heads' logits fit, kept
    command = f"python -m tadm train {name}" + (f" --replicate {replicate}" if replicate else "")
    with hold_run(paths.checkpoints, d, command, {"model": paths.model.parent, "metrics": paths.metrics.parent}):
        return _train(name, p, d, data_dir, meta, data, paths, log, restart, command, checkpoint_heads)


def _train(name: str, p: Params, d: Dist, data_dir: Path, meta: dict, data: tuple[PackedTokens, PackedTokens],
           paths: RunPaths, log, restart: bool, command: str, checkpoint_heads: bool = True) -> dict:
    """:func:`train`'s body, run under the lock of the run's directory (`paths`) on the data
    `train` opened (`meta`: the pack manifest's counts; `data`: the train and validation splits;
    `checkpoint_heads`: the memory check's answer, Method.checkpoint_heads).

    One function on purpose (nanoGPT's shape): build, resume, then the loop -- the step, the
    logged / validated / checkpointed steps, the release -- read top to bottom, so the order of
    its effects (the generators seeded per micro-batch, the host syncs, the checkpoint writes)
    is visible in one place; its syntax is also part of every run's fingerprint."""
    method = get_method(name, p)
    method.checkpoint_heads = checkpoint_heads
    method.compile_heads = COMPILE_BACKEND if p.runtime.compile else None  # each readout chunk compiled
    n_micro = p.train.global_batch // p.train.micro_batch
    if n_micro % d.world:
        raise ConfigError("train.global_batch", f"global_batch/micro_batch = {n_micro} micro-batches must divide among {d.world} processes")

    manifest = data_dir / "manifest.json"
    train_data, valid_data = data
    vocab, seq_len = meta["vocab_size"], meta["seq_len"]

    torch.manual_seed(_seed(p.seed, 0x1417))  # identical initial weights on every rank
    with torch.device(d.device):  # built where it trains (no tensor left on the default device)
        model = method.build_model(vocab, seq_len)
    set_autocast_residual(model, p.train.residual == "bf16")
    names = [n for n, _ in model.named_parameters()]
    opt = adamw(model.parameters(), d.device, lr=p.train.lr, betas=tuple(p.train.betas), eps=p.train.eps,
                weight_decay=p.train.weight_decay)
    ema = EMA(model, p.train.ema)
    settings = run_settings(name, p, manifest, method)
    fp = checkpoint.fingerprint(settings)

    quiet = log if d.main else (lambda *_: None)
    if d.world > 1:
        quiet(f"[{name}] {d.world} processes on {d.device.type}, {n_micro // d.world} micro-batches of "
              f"{p.train.micro_batch} each per step (global batch {p.train.global_batch})")
    start, history, evals, init_nelbo = 0, [], [], None
    state = resume_state(paths.checkpoints, names, settings, steps=p.train.steps, steps_key="train.steps",
                         restart=restart, hint=f"`{command} --restart`", d=d, log=quiet,
                         expected=model.state_dict())
    if state is not None:
        model.load_state_dict(state.model)  # host tensors copied into the model on its device
        ema.load(state.ema)
        checkpoint.restore_optimizer(opt, state.optimizer)
        start, history, evals = state.step, state.extra["history"], state.extra["evals"]
        init_nelbo = state.extra["init_nelbo"]
        quiet(f"[{name}] resumed from step {start}")
        del state
    if init_nelbo is None:
        init_nelbo = evaluate(method, model, valid_data, p, d)
        evals.append({"step": 0, "val_nelbo": init_nelbo, "val_ppl_bound": math.exp(min(init_nelbo, 50))})

    ddp, net = wrap(model, d, p.runtime.compile)
    batches = GlobalBatches(len(train_data), p.train.global_batch, p.seed)
    autocast = runtime.autocast(d.device, p.train.precision)
    mine = runtime.shard(n_micro, d)  # this process's micro-batches of the step
    tokens_per_step = p.train.global_batch * seq_len
    bar = tqdm(range(start, p.train.steps), initial=start, total=p.train.steps, desc=f"train[{name}]",
               unit="step", disable=not d.main)
    t_last, steps_since = time.perf_counter(), 0
    watch = FiniteWatch(name, d.device)
    def tokens(step: int) -> tuple[torch.Tensor, ...]:
        return step_tokens(train_data, batches.indices(step), mine, p.train.micro_batch, d.device)
    xs = tokens(start) if start < p.train.steps else ()
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, p)
        loss_sum = torch.zeros((), dtype=torch.float64, device=d.device)  # read once per logged step
        for k, (j, x) in enumerate(zip(mine, xs)):
            gen = torch.Generator(device=d.device).manual_seed(_seed(p.seed, step, j))
            if p.model.dropout:  # dropout draws from the global generators: seed them the same way
                torch.manual_seed(_seed(p.seed, step, j, 0xD809))
            sync = ddp.no_sync() if (d.world > 1 and k < len(mine) - 1) else nullcontext()
            with sync:
                with autocast:
                    per_seq = method.loss(net, x, gen, progress=step / p.train.steps)
                    loss = per_seq.float().sum() / x.numel()
                (loss / len(mine)).backward()
            loss_sum += loss.detach().double()
        if step + 1 < p.train.steps:  # the next step's tokens: copied while this step computes
            xs = tokens(step + 1)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)
        steps_since += 1
        done = step + 1
        watch.observe(done, loss_sum, grad_norm, method.take_excess())

        logged, evaluated = done % p.train.log_every == 0, done % p.train.eval_every == 0
        saved = done % p.train.checkpoint_every == 0 or done == p.train.steps
        if logged or evaluated or saved:  # a host sync these steps make anyway: stop a diverged run first
            watch.check(d.world, lambda: checkpoint.last_good(paths.checkpoints))
        if logged or done == p.train.steps:
            train_loss = all_mean(float(loss_sum) / len(mine), d)  # the host sync of the interval
            now = time.perf_counter()
            row = {"step": done, "train_loss": train_loss, "lr": learning_rate(step, p),
                   "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_step * steps_since / (now - t_last)}
            history.append(row)
            t_last, steps_since = now, 0
            bar.set_postfix(loss=f"{row['train_loss']:.3f}")
        if evaluated or done == p.train.steps:
            # validation on the EMA weights, the ones that get released
            live = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(ema.state_dict(model))
            nelbo = evaluate(method, model, valid_data, p, d)
            model.load_state_dict(live)
            check_value(name, "validation NELBO", done, nelbo, lambda: checkpoint.last_good(paths.checkpoints))
            evals.append({"step": done, "val_nelbo": nelbo, "val_ppl_bound": math.exp(min(nelbo, 50))})
        if d.main and saved:
            extra = {"fingerprint": fp, "settings": settings, "history": history, "evals": evals,
                     "init_nelbo": init_nelbo}
            # keep two while training (a kill mid-write still leaves one); at the end only the last
            state = checkpoint.TrainState(done, model.state_dict(), ema.state_dict(model), opt.state_dict(), extra)
            checkpoint.save(paths.checkpoints, state, names, keep=1 if done == p.train.steps else 2)
            _write_rows(paths.metrics.with_suffix(".csv"), history)
            _write_rows(paths.metrics.with_name(paths.metrics.name + "_eval.csv"), evals)

    summary = {}
    if d.main:
        model.load_state_dict(ema.state_dict(model))
        model.save_pretrained(paths.model)
        speeds = [r["tokens_per_s"] for r in history[1:]] or [r["tokens_per_s"] for r in history]
        unigram = valid_data.unigram_entropy()
        summary = {
            "run": paths.model.name, "model_type": method.model_type, "seed": p.seed, "steps": p.train.steps,
            "parameters": sum(t.numel() for t in model.parameters()),
            "val_nelbo_init": init_nelbo, "val_nelbo": evals[-1]["val_nelbo"],
            "val_ppl_bound": evals[-1]["val_ppl_bound"],
            # the line a model using no context cannot cross, and how far below it this one is
            "unigram_entropy": unigram, "below_unigram": unigram - evals[-1]["val_nelbo"],
            "train_tokens_per_s": sorted(speeds)[len(speeds) // 2] if speeds else None,
        }
        atomic_write_json(paths.metrics.with_suffix(".json"), summary)
        atomic_write_text(paths.model / CARD_FILE, model_card(summary, p, method, meta))
        _write_rows(paths.metrics.with_suffix(".csv"), history)
        _write_rows(paths.metrics.with_name(paths.metrics.name + "_eval.csv"), evals)
    runtime.barrier(d)
    return summary
