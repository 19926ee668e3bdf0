"""Anchor staleness: how far a cached anchor drifts from a fresh one, and what the fusion recovers.

Along real reverse trajectories of a trained TADM (every step with a fresh anchor, so the
trajectory itself is the uncached model's), for every step i and cache age k = 0..max_age the
anchor that Alg. 1 would serve, h_stale = A(S(z_{i-k})), is compared with the fresh anchor
h_fresh = A(S(z_i)) on the same canvas z_i:

    cosine        mean over positions of cos(h_stale^l, h_fresh^l)
    rel_l2        ||h_stale - h_fresh|| / ||h_fresh||            (over the whole canvas)
    gate          mean fusion gate sigmoid(W_g u + b_g) with the stale anchor
    correction    ||gate * Delta|| / ||h_stale||: how much the fusion moves the stale anchor
    kl_fused      KL(p_fresh || p_fused)     p_fused = D(Phi(S(z_i), h_stale)), what Alg. 1 predicts
    kl_bypass     KL(p_fresh || p_bypass)    p_bypass = D(h_stale): the fusion bypassed, the stale
                                             anchor read as is by the same denoiser (no current
                                             canvas; `TADM.denoise_hidden(..., fusion=False)`, Table 2's
                                             tadm_nofusion row)
    kl_reused     KL(p_fresh || p_reused)    p_reused = D(Phi(S(z_{i-k}), h_stale)), the prediction
                                             of step i - k served again (no current state at all);
                                             it is p_fresh of step i - k, computed once per step
    recovery      1 - kl_fused / kl_bypass: the share of the fusion-bypassed gap that running the
                  fusion on the current canvas closes (1: all of it, 0: none). This is the fusion's
                  own ablation: against D(h_stale), not against re-serving a prediction
    recovery_vs_reused   1 - kl_fused / kl_reused: the share of the gap of re-serving the stale
                  prediction that Alg. 1 closes (the claims' fusion-recovery finding); it credits
                  the fusion with all that seeing the current canvas gives, while `recovery` is
                  the fusion's own ablation

The bypass is out of the denoiser's training distribution even for a fresh anchor (D was trained
on Phi's output), so kl_bypass is > 0 at age 0 too: the age-0 row is its floor, the cost of
removing Phi alone, and the growth with age is what staleness adds to it (`growth_bypass`).

KLs are averaged over the positions still masked in z_i (the only ones a sampler reads), in
float64. Age 0 is the fresh anchor itself (cosine 1, kl_fused = kl_reused = 0) and is included as
a reference row.

Uncertainty over sequences, not steps. The steps of one batched trajectory are autocorrelated, so
they are not independent draws; the sequences of the batch are. Every quantity is kept per
sequence as a numerator and a denominator (a KL: its sum over the sequence's masked positions and
their count; rel_l2 and correction: squared norms; cosine and gate: sums and counts), so that a
step's batch value is f(sum num / sum den) over the batch -- the same value as computed on the
whole batch -- and a per-age value is the mean over steps of those. `summary` reports each per-age
mean and, as ``<quantity>_se``, the standard deviation over `bootstrap` resamples of the
num_samples SEQUENCES (drawn with replacement, one seeded generator; every step's value, every
ratio and every mean recomputed from the resampled sequences), likewise for the growth ratios
relative to age 1 (``growth_<kl>`` = KL at the age / KL at age 1) and for the mean recovery over
ages 1..max_age (``recovery_mean``, ``recovery_vs_reused_mean``).

Device: `measure(..., dist=)` runs on the device of a `tadm.runtime.Dist` (the notebook's
runtime setting). The trajectories are sampled under `runtime.autocast` like every sampling run;
the anchors, fusions and predictions compared are computed in fp32 even on a GPU, since bf16's
rounding (~0.4 %) is the size of the drifts measured (TF32 off too). One process: a single batched trajectory
has nothing to split.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from tadm import runtime
from tadm.experiments.sampling import network_autocast
from tadm.metrics.bootstrap import resamples
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample


@dataclass(frozen=True)
class StalenessSettings:
    steps: int = 128  # T of the recorded trajectories
    max_age: int = 8  # largest cache age k examined
    num_samples: int = 20  # sequences of the batched trajectory: the units the uncertainty is over
    sampler: str = "mdlm"
    nucleus_p: float = 0.9
    seed: int = 0


# the per-sequence parts of every base quantity: a step's batch value is FINISH(sum num / sum den)
BASE = ["cosine", "rel_l2", "gate", "correction", "kl_fused", "kl_bypass", "kl_reused"]
_SQRT = {"rel_l2", "correction"}
# quantities derived from a step's base values
DERIVED = ["recovery", "recovery_vs_reused"]
QUANTITIES = BASE[:4] + ["kl_fused", "kl_bypass", "kl_reused", "recovery", "recovery_vs_reused"]
GROWTH = ["kl_fused", "kl_bypass", "kl_reused"]  # growth_<q>: q at the age / q at age 1
BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0xB007  # tadm.metrics.bootstrap.SEED


@dataclass
class Staleness:
    """What `measure` returns: `rows`, one dict per (step, age) with the batch values of the
    module docstring (for the figure and the per-step frame), and `num` / `den`, for each base
    quantity an array (len(rows), num_samples) of its per-sequence numerators and denominators
    (a row's batch value is `_finish(q, num.sum(1) / den.sum(1))`)."""

    rows: list[dict]
    num: dict[str, np.ndarray] = field(default_factory=dict)
    den: dict[str, np.ndarray] = field(default_factory=dict)

    def frame(self):
        import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the frame needs it

        return pd.DataFrame(self.rows)

    @property
    def num_sequences(self) -> int:
        return next(iter(self.num.values())).shape[1]


def record_trajectory(model, seq_len: int, cfg: StalenessSettings,
                      dist: runtime.Dist | None = None) -> list[tuple[float, Tensor]]:
    """[(t, z_t)] of one batched reverse process with a fresh anchor every step (under the
    autocast of `dist`, on the model's device)."""

    canvases: list[tuple[float, Tensor]] = []
    settings = SamplerSettings(sampler=cfg.sampler, steps=cfg.steps, nucleus_p=cfg.nucleus_p, seed=cfg.seed,
                               ddpm_cache=False, autocast="fp32" if dist is None else network_autocast(dist))
    with make_adapter(model, FixedInterval(1)) as adapter:
        sample(adapter, settings, num_samples=cfg.num_samples, seq_len=seq_len,
               callback=lambda info: canvases.append((info.t, info.z_t.clone())))
    return canvases


def _kl_parts(p: Tensor, p_neg_entropy: Tensor, q_log: Tensor, w: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per sequence: (sum over its positions weighted by `w` (B, L) of KL(p || q), sum of `w`),
    from p's probabilities and sum p log p (B, L) and q's log-probabilities (B, L, V); float64."""
    kl = p_neg_entropy - torch.einsum("blv,blv->bl", p, q_log)
    return (kl * w).sum(-1).cpu().numpy(), w.sum(-1).cpu().numpy()


def _log_probs(model, x: Tensor) -> Tensor:
    """SUBS log-probabilities over the vocabulary (the mask column dropped), float64."""
    return model.head(x)[..., : model.mask_id].double().log_softmax(-1)


def _finish(q: str, ratio):
    """A base quantity's value from its (summed) num / den."""
    return np.sqrt(ratio) if q in _SQRT else ratio


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _recovery(kl_fused, kl_ref):
    """1 - kl_fused / kl_ref where kl_ref > 1e-12, else nan."""
    kl_fused, kl_ref = np.asarray(kl_fused, np.float64), np.asarray(kl_ref, np.float64)
    ok = kl_ref > 1e-12
    return np.where(ok, 1.0 - kl_fused / np.where(ok, kl_ref, 1.0), np.nan)


@torch.no_grad()
def measure(model, seq_len: int, cfg: StalenessSettings = StalenessSettings(),
            dist: runtime.Dist | None = None) -> Staleness:
    """The rows (one per (step, age)) and per-sequence parts of the module docstring. With `dist`
    the model is moved to its device first (None: where it is, no autocast)."""
    if dist is not None:
        model = model.to(dist.device)
    model.eval()
    trajectory = record_trajectory(model, seq_len, cfg, dist)
    with _full_fp32():
        return _compare(model, trajectory, cfg)


@contextlib.contextmanager
def _full_fp32():
    """TF32 matmuls off for the comparisons (their rounding is the size of what is measured)."""
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    runtime.configure_backends(False)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


# Memory of the comparison: the log-probabilities of max_age + 1 steps, twice (fresh and fusion
# bypassed), plus four more, each (sequences, L, V) in float64. Above this budget the sequences
# are compared in chunks (every quantity is per sequence, so the result is the same); at the
# paper's L = 1024 and V = 50,257 one sequence needs ~10 GiB at max_age 8, 20 sequences ~200 GiB.
MEMORY_BUDGET = 4 * 2**30


def sequence_chunk(batch: int, seq_len: int, vocab: int, max_age: int, budget: int | None = None) -> int:
    """How many sequences `_compare` takes at a time: all of them when they fit `budget`
    (default MEMORY_BUDGET)."""
    budget = MEMORY_BUDGET if budget is None else budget
    per_sequence = (2 * (max_age + 1) + 4) * seq_len * vocab * 8
    return max(1, min(batch, budget // per_sequence))


def _compare(model, trajectory: list[tuple[float, Tensor]], cfg: StalenessSettings) -> Staleness:
    batch, seq_len = trajectory[0][1].shape
    chunk = sequence_chunk(batch, seq_len, model.mask_id, cfg.max_age)
    parts = [_compare_sequences(model, [(t, z[s:s + chunk]) for t, z in trajectory], cfg)
             for s in range(0, batch, chunk)]
    num = {q: np.concatenate([n[q] for n, _ in parts], axis=1) for q in BASE}
    den = {q: np.concatenate([d[q] for _, d in parts], axis=1) for q in BASE}
    rows, r = [], 0
    for i, (t, z) in enumerate(trajectory):
        masked_fraction = float((z == model.mask_id).double().mean())
        for k in range(0, min(cfg.max_age, i) + 1):
            row = {"step": i, "t": t, "age": k, "masked_fraction": masked_fraction}
            for q in BASE:
                row[q] = float(_finish(q, _ratio(num[q][r].sum(), den[q][r].sum())))
            row["recovery"] = float(_recovery(row["kl_fused"], row["kl_bypass"]))
            row["recovery_vs_reused"] = float(_recovery(row["kl_fused"], row["kl_reused"]))
            rows.append(row)
            r += 1
    return Staleness(rows, num, den)


def _compare_sequences(model, trajectory: list[tuple[float, Tensor]],
                       cfg: StalenessSettings) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-sequence numerators and denominators, (steps x ages, sequences) per base quantity."""
    anchors = [model.anchor(z) for _, z in trajectory]
    fresh_lp: dict[int, Tensor] = {}  # p_fresh of step j = p_reused of (j + k, k), kept for max_age steps
    bypass_lp: dict[int, Tensor] = {}  # D(h_j), the fusion bypassed, kept likewise
    num, den = {q: [] for q in BASE}, {q: [] for q in BASE}
    for i, (t, z) in enumerate(trajectory):
        masked = z == model.mask_id
        embed = model.embed(z)
        fresh = anchors[i]
        fresh_lp[i] = _log_probs(model, model.denoise_hidden(z, fresh))
        bypass_lp[i] = _log_probs(model, model.denoiser(fresh))  # = denoise_hidden(z, fresh, fusion=False)
        fresh_lp.pop(i - cfg.max_age - 1, None)
        bypass_lp.pop(i - cfg.max_age - 1, None)
        p_fresh = fresh_lp[i]
        prob = p_fresh.exp()
        neg_entropy = torch.einsum("blv,blv->bl", prob, p_fresh)
        w = masked.double()
        L, d = fresh.shape[1], fresh.shape[2]
        for k in range(0, min(cfg.max_age, i) + 1):
            stale = anchors[i - k]
            gate, delta = model.fusion.correction(embed, stale)
            # Phi(S(z_i), h_stale) = h_stale + gate * Delta, exactly Fusion.forward (computed once here)
            p_fused = p_fresh if k == 0 else _log_probs(model, model.denoiser(stale + gate * delta))
            parts = {
                "cosine": (torch.nn.functional.cosine_similarity(stale, fresh, dim=-1).double().sum(-1), L),
                "rel_l2": ((stale - fresh).double().square().sum((1, 2)), fresh.double().square().sum((1, 2))),
                "gate": (gate.double().sum((1, 2)), L * d),
                "correction": ((gate * delta).double().square().sum((1, 2)), stale.double().square().sum((1, 2))),
            }
            for q, (a, b) in parts.items():
                a = a.cpu().numpy()
                num[q].append(a)
                den[q].append(np.broadcast_to(np.asarray(b.cpu().numpy() if torch.is_tensor(b) else b, np.float64),
                                              a.shape).copy())
            for q, other in (("kl_fused", p_fused), ("kl_bypass", bypass_lp[i - k]), ("kl_reused", fresh_lp[i - k])):
                a, b = _kl_parts(prob, neg_entropy, other, w)
                num[q].append(a)
                den[q].append(b)
    return {q: np.stack(v) for q, v in num.items()}, {q: np.stack(v) for q, v in den.items()}


def _per_age(values: np.ndarray, ages: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Mean over the rows of each age (nan-skipping) of `values` (rows, R) -> (ages, R)."""
    out = np.full((len(order), values.shape[1]), np.nan)
    for j, a in enumerate(order):
        sel = values[ages == a]
        ok = np.isfinite(sel)
        n = ok.sum(0)
        out[j] = np.where(n > 0, np.where(ok, sel, 0.0).sum(0) / np.maximum(n, 1), np.nan)
    return out


def _aggregate(m: Staleness, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Per-age values of every quantity, growth ratio and the mean recovery, for sequence
    `weights` (R, num_samples): how often each sequence is drawn in each of R resamples."""
    ages = np.asarray([r["age"] for r in m.rows])
    order = np.unique(ages)
    step = {q: _finish(q, _ratio(m.num[q] @ weights.T, m.den[q] @ weights.T)) for q in BASE}  # (rows, R)
    step["recovery"] = _recovery(step["kl_fused"], step["kl_bypass"])
    step["recovery_vs_reused"] = _recovery(step["kl_fused"], step["kl_reused"])
    out = {q: _per_age(step[q], ages, order) for q in QUANTITIES}
    if 1 in order:
        one = int(np.flatnonzero(order == 1)[0])
        for q in GROWTH:
            with np.errstate(divide="ignore", invalid="ignore"):
                out[f"growth_{q.removeprefix('kl_')}"] = out[q] / out[q][one]
        for q in DERIVED:  # the mean over ages 1..max_age: recovery_mean, recovery_vs_reused_mean
            aged = out[q][order >= 1]
            n_ok = np.isfinite(aged).sum(0)
            mean = np.where(np.isfinite(aged), aged, 0.0).sum(0) / np.maximum(n_ok, 1)
            out[f"{q}_mean"] = np.broadcast_to(np.where(n_ok > 0, mean, np.nan), out[q].shape)
    return out


def summary(m: Staleness, bootstrap: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED):
    """One line per cache age (index "age"): the mean over the recorded steps of every quantity
    (QUANTITIES), the growth ratios relative to age 1 (growth_fused, growth_bypass, growth_reused)
    and the mean recoveries over ages 1..max_age (recovery_mean, recovery_vs_reused_mean, the same on
    every line), each with
    ``<column>_se``: its standard deviation over `bootstrap` resamples of the SEQUENCES (module
    docstring; one generator seeded with `seed`)."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the summary needs it


    if not isinstance(m, Staleness):
        raise TypeError("staleness.summary needs measure()'s Staleness (its per-sequence parts), "
                        f"got {type(m).__name__}")
    n = m.num_sequences
    point = _aggregate(m, np.ones((1, n)))
    idx = resamples(n, bootstrap, seed)  # (B, n) sequence indices
    weights = np.zeros((bootstrap, n))
    np.add.at(weights, (np.repeat(np.arange(bootstrap), n), idx.ravel()), 1.0)
    boot = _aggregate(m, weights)
    ages = np.unique([r["age"] for r in m.rows])
    cols = list(point)
    table = pd.DataFrame({c: point[c][:, 0] for c in cols}, index=pd.Index(ages.astype(int), name="age"))
    se = {}
    for c in cols:
        v = boot[c]
        ok = np.isfinite(v)
        cnt = ok.sum(1)
        mean = np.where(ok, v, 0.0).sum(1) / np.maximum(cnt, 1)
        var = np.where(ok, (v - mean[:, None]) ** 2, 0.0).sum(1) / np.maximum(cnt - 1, 1)
        se[f"{c}_se"] = np.where(cnt > 1, np.sqrt(var), np.nan)
    table = table.join(pd.DataFrame(se, index=table.index))
    table["sequences"] = n  # the bootstrap's units (the claims table's n)
    return table


def growth(table, age: int | None = None, kl: str = "kl_fused") -> tuple[float, float]:
    """(`kl` at `age` / `kl` at age 1, its standard error) from `summary`: the bootstrap over
    sequences (``growth_<kl>_se``) when the table has it, else first order from the per-age
    errors; `age` None: the oldest age recorded."""

    age = int(table.index.max()) if age is None else age
    a, b = table.loc[age], table.loc[1]
    ratio = a[kl] / b[kl]
    col = f"growth_{kl.removeprefix('kl_')}_se"
    if col in table.columns:
        return float(ratio), float(a[col])
    return float(ratio), float(abs(ratio) * math.sqrt((a[f"{kl}_se"] / a[kl]) ** 2 + (b[f"{kl}_se"] / b[kl]) ** 2))


def growth_note(table, target: float = 10.0) -> str:
    """One paragraph, with this run's numbers, on how the stale-vs-fresh KL grows with cache age
    against `target` (the growth from age 1 to the oldest age), and why
    it falls short when it does: the unfused reuse KL's power law in the age (a log-log fit,
    KL_reused ~ age^p) bounds the growth to about oldest^p, so `target` needs
    p >= log(target) / log(oldest); the fusion's recovery sets how much of it reaches the output."""


    top = int(table.index.max())
    fused, fused_se = growth(table)
    aged = table.loc[[a for a in table.index if a >= 1]]
    reused = float(aged.kl_reused.loc[top] / aged.kl_reused.loc[1])
    pos = aged[aged.kl_reused > 0]  # a log-log fit needs positive KLs at two ages or more
    p = (float(np.polyfit(np.log(pos.index.to_numpy(dtype=float)), np.log(pos.kl_reused.to_numpy(dtype=float)), 1)[0])
         if len(pos) >= 2 else float("nan"))
    need = math.log(target) / math.log(top) if top > 1 else float("inf")
    rec1, rec_top = float(aged.recovery.loc[1]), float(aged.recovery.loc[top])
    text = (f"From cache age 1 to {top} the KL of the fused prediction from the fresh one grows {fused:.1f}x "
            f"(± {fused_se:.1f}x; {aged.kl_fused.loc[1]:.2e} -> {aged.kl_fused.loc[top]:.2e} nats/token) and that of "
            f"the reused, unfused anchor {reused:.1f}x ({aged.kl_reused.loc[1]:.2e} -> {aged.kl_reused.loc[top]:.2e}); "
            f"the target is {target:g}x.")
    gap = "the gap"
    if "kl_bypass" in table.columns:  # the fusion's own ablation: D(h_stale), the fusion bypassed
        bypass, bypass_se = growth(table, kl="kl_bypass")
        text += (f" With the fusion bypassed (the stale anchor read as is, D(h_stale)) the KL is "
                 f"{table.kl_bypass.loc[0]:.2e} already at age 0 (removing the fusion alone) and grows {bypass:.1f}x "
                 f"(± {bypass_se:.1f}x; {aged.kl_bypass.loc[1]:.2e} -> {aged.kl_bypass.loc[top]:.2e}) from age 1 to {top}.")
        gap = "the fusion-bypassed gap (1 - KL_fused / KL_bypass)"
    if fused >= target:
        return text + " The target is met."
    return text + (f" Not met, because the reuse KL grows as age^{p:.2f} (log-log fit over ages 1..{top}), close to "
                   f"linear, and {target:g}x over ages 1..{top} needs an exponent of at least {need:.2f}; the fusion "
                   f"then closes {rec1:.3f} of {gap} at age 1 and {rec_top:.3f} at age {top}"
                   + (", more as the cache ages, so the fused KL grows less still." if rec_top > rec1 else "."))


def figure(df):
    """Four panels from `measure`'s rows (`Staleness.frame()` with a "t bin" column): anchor
    similarity and distance, the prediction gap with the fusion (per time bin) beside the fusion
    bypassed and the reused prediction (means over steps; log scale), and the share of the
    bypassed gap the fusion recovers, each against cache age, one line per diffusion-time bin."""
    import matplotlib  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them
    import seaborn as sns  # lazy: matplotlib and seaborn take ~2.5 s to import; only the figure needs them

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    aged = df[df.age > 0]
    panels = [(df, "cosine", "cos(stale anchor, fresh anchor)"), (df, "rel_l2", "‖stale − fresh‖ / ‖fresh‖"),
              (aged, "kl_fused", "KL(fresh ‖ stale + fusion), per t bin  [nats/token]"),
              (aged, "recovery", "gap closed by the fusion: 1 − KL_fused / KL_bypass")]
    for ax, (data, y, title) in zip(axes.flat, panels):
        sns.lineplot(data=data, x="age", y=y, hue="t bin", marker="o", errorbar=None, ax=ax)
        ax.set_title(title)
        ax.set_xlabel("cache age k (steps since the anchor was computed)")
        ax.set_ylabel("")
    kl = aged.groupby("age")[["kl_fused", "kl_bypass", "kl_reused"]].mean()
    axes[1, 0].plot(kl.index, kl.kl_bypass, "k:", lw=1.5, label="fusion bypassed: D(h_stale)")
    axes[1, 0].plot(kl.index, kl.kl_reused, "k--", lw=1, label="reused prediction (no current state)")
    if (kl.to_numpy() > 0).all():
        axes[1, 0].set_yscale("log")
    axes[1, 0].legend(fontsize=7)
    fig.suptitle("Anchor staleness along reverse trajectories")
    fig.tight_layout()
    return fig


__all__ = ["StalenessSettings", "Staleness", "record_trajectory", "measure", "summary", "growth", "growth_note",
           "figure", "QUANTITIES"]
