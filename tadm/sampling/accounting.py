"""Table 2's compute column, counted from real sampling runs at the paper's depths.

The column is the number of Transformer-layer calls one reverse trajectory makes (paper
Sec. 3.3): MDLM 12 T, ADLM (12 + 6) T, TADM 6 T + 12 ceil(T / K) with K from Table 2's
schedule; its models are those of every method unit with ``compute_column`` (`kinds`), in
registration order. `compute_column` builds each model at the paper's depths (12 / 12 / 6 layers; the
count does not depend on the width, the vocabulary or the canvas, so those are kept tiny and
the weights random), runs the real sampling loop for T steps with every network call made
(ddpm_cache off, as the paper's fixed-step budget; a unit that ``refreshes`` with Table 2's K),
and reads the counters its hooks filled. Nothing is computed from the formula: the unit's
`Method.layer_calls` is printed beside the count only as a check, and the paper's published numbers (`PUBLISHED`) beside both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import torch

from tadm.config import ModelConfig
from tadm.models import build_model
from tadm.registry import METHODS, method_for
from tadm.sampling.adapters import make_adapter
from tadm.sampling.anchor_cache import PAPER_REFRESH_SCHEDULE, BudgetSchedule
from tadm.sampling.base import SamplerSettings
from tadm.sampling.loop import sample

# The paper's Table 2, compute column (layer calls per generation), for T = 2048 and 4096.
PUBLISHED = {
    2048: {"mdlm": 24576, "adlm": 36864, "tadm": 18432},
    4096: {"mdlm": 49152, "adlm": 73728, "tadm": 36864},
}
PAPER_DEPTHS = dict(mdlm_layers=12, anchor_layers=12, denoiser_layers=6)


def kinds() -> tuple[str, ...]:
    """The networks (model_type) the column counts: every unit with ``compute_column``, in
    registration order (MDLM, ADLM, TADM); read when asked, so a unit registered later counts."""
    return tuple(dict.fromkeys(u.model.model_type for u in METHODS.values() if u.compute_column))


def _model(kind: str, cfg: ModelConfig, vocab: int, seq_len: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(kind, cfg, vocab, seq_len)
    with torch.no_grad():  # random, non-degenerate outputs (a fresh head is zero)
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model.eval()


def compute_column(steps: list[int], schedule: dict[int, int] | None = None, depths: dict[str, int] | None = None,
                   width: int = 32, vocab: int = 64, seq_len: int = 8, seed: int = 0) -> Iterator[dict]:
    """One row per (T, model): layer calls counted during a real T-step sampling run, the
    paper's formula, the published value (if any), anchor calls, and the run's wall time."""
    schedule = dict(PAPER_REFRESH_SCHEDULE if schedule is None else schedule)
    depths = dict(PAPER_DEPTHS if depths is None else depths)
    cfg = dataclasses.replace(ModelConfig(), d_model=width, n_heads=2, mlp_ratio=2, **depths)
    for T in steps:
        if T not in schedule:
            raise ValueError(f"no refresh interval K for T={T} in the schedule {schedule}")
        K = schedule[T]
        for kind in kinds():
            unit = method_for(kind)
            model = _model(kind, cfg, vocab, seq_len, seed)
            with make_adapter(model, BudgetSchedule(schedule) if unit.refreshes else None) as adapter:
                result = sample(adapter, SamplerSettings(steps=T, ddpm_cache=False, seed=seed), num_samples=1,
                                seq_len=seq_len)
            c = result.counters
            formula = unit.layer_calls(cfg, T, K if unit.refreshes else 1)
            yield {"T": T, "model": kind, "K": K if unit.refreshes else None,
                   "layer_calls": c.layer_calls, "anchor_layer_calls": c.anchor_layer_calls,
                   "denoiser_layer_calls": c.denoiser_layer_calls, "anchor_calls": c.anchor_calls,
                   "model_calls": c.model_calls, "formula": formula,
                   "published": PUBLISHED.get(T, {}).get(kind) if depths == PAPER_DEPTHS else None,
                   "refreshes": len(result.refresh_steps[0]) if result.refresh_steps else None,
                   "expected_refreshes": math.ceil(T / K) if unit.refreshes else None,
                   "seconds": result.seconds}


def to_markdown(rows: list[dict]) -> str:
    """The compute column as a Markdown table, relative to MDLM at the same T."""
    mdlm = {r["T"]: r["layer_calls"] for r in rows if r["model"] == "mdlm"}
    lines = ["| T | model | K | layer calls (counted) | vs MDLM | formula | paper | matches paper |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        paper = r["published"]
        lines.append(f"| {r['T']} | {r['model'].upper()} | {r['K'] or '-'} | {r['layer_calls']:,} | "
                     f"{r['layer_calls'] / mdlm[r['T']]:.2f}x | {r['formula']:,} | "
                     f"{'-' if paper is None else f'{paper:,}'} | "
                     f"{'-' if paper is None else ('yes' if paper == r['layer_calls'] else 'NO')} |")
    return "\n".join(lines) + "\n"


__all__ = ["PUBLISHED", "PAPER_DEPTHS", "kinds", "compute_column", "to_markdown"]
