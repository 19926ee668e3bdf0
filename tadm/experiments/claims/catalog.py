"""The paper's claims, one `Entry` each, in the order the claims table shows them, and their
evaluation (`evaluate`): every entry measured by its evidence, gated by the preconditions, then
decided together. The paper's figures live here; `claim`, `test` and `source` are templates
({T}: this profile's budget, {claims.<name>}: params `claims`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from tadm import compute
from tadm.experiments.claims.claim import CHECK, EQUIVALENCE, NON_INFERIORITY, Claim, Entry
from tadm.experiments.claims import evidence_posttrain, evidence_pretrain  # noqa: F401  (they register their evaluators)
from tadm.experiments.claims.evidence import measure
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.preconditions import apply_preconditions, preconditions
from tadm.experiments.claims.rules import Rules, decide, mde, n_for_paper

T2L = "TADM:Pretraining uses 25% fewer Transformer-layer calls than MDLM at T = 2048 (K = 4)"
T1L = "up to 38% fewer layer calls than MDLM (T = 1024, K = 8)"
LAYER_CALLS_TEST = "TADM / MDLM layer calls == the design's (counted, exact)"
PRESERVES = "TADM:Post-train preserves the base's task accuracy (within noise)"
# the declared Holm families: the pretraining findings (Table 2's TADM checkpoints, their speed and
# the refresh sweep), the post-train ones (Table 1's trained fusions against the base and the
# control) and the fusion against each training-free cache of claims.training_free_comparator
PRETRAINING, POSTTRAIN, TRAINING_FREE = "pretraining", "posttrain", "training_free"


def paper_bound_vs_adlm(K: int = 8, d: int = 768, L: int = 1024, V: int = 50257, anchor: int = 12,
                        denoiser: int = 6) -> float:
    """TADM's FLOP-bound speed-up over ADLM at the paper's settings (d = 768, L = 1024, GPT-2's
    vocabulary, 12 anchor / 6 denoiser blocks, K = 8), per reverse step and token (tadm.compute):
    ADLM runs all 18 blocks, its anchor head, the anchor re-embedding and the output head; TADM
    its denoiser blocks, the anchor blocks every K-th step, the fusion and the output head."""
    block, head = compute.dit_block_flops(d, L), compute.lm_head_flops(d, V + 1)
    adlm = (anchor + denoiser) * block + 2 * head + compute.dense_flops(V + 1, d)
    tadm = (denoiser + anchor / K) * block + compute.fusion_flops(d) + head
    return adlm / tadm


def paper_bound_posttrain(K: int = 3, split: tuple[int, int, int] = (2, 20, 8)) -> float:
    """TADM:Post-train's layer-call bound over its base at the paper's 2/20/8 split and K: the
    paper's compute column (0.56x at K = 3)."""
    s, a, d = split
    return (s + a + d) / (s + d + a / K)


_ADLM_BOUND = paper_bound_vs_adlm()
_PT_BOUND = paper_bound_posttrain()

CATALOG: tuple[Entry, ...] = (
    # --- implementation checks: Table 2's compute column (Sec. 3.3)
    Entry("compute_T2L", T2L, "0.75x (18432 / 24576)", "layer_calls", CHECK, rows=("tadm", "mdlm"), budget=2,
          paper_value=0.75, test=LAYER_CALLS_TEST, source="results/table2/{{tadm,mdlm}}.json"),
    Entry("compute_T2L_paper_depths", T2L + " (counted at the paper's 12/12/6 depths)", "0.75x (18432 / 24576)",
          "layer_calls_paper_depths", CHECK, rows=("tadm", "mdlm"), budget=2, paper_value=0.75, test=LAYER_CALLS_TEST,
          source="metrics/compute_column.json"),
    Entry("compute_T1L", T1L, "0.625x (-37.5%)", "layer_calls", CHECK, rows=("tadm", "mdlm"), budget=1,
          paper_value=0.625, test=LAYER_CALLS_TEST, source="results/table2/{{tadm,mdlm}}.json"),
    Entry("compute_T1L_paper_depths", T1L + " (counted at the paper's 12/12/6 depths)", "0.625x (-37.5%)",
          "layer_calls_paper_depths", CHECK, rows=("tadm", "mdlm"), budget=1, paper_value=0.625, test=LAYER_CALLS_TEST,
          source="metrics/compute_column.json"),
    # --- Table 2
    Entry("throughput_vs_adlm", "TADM samples faster than ADLM at T = 1024, K = 8 (up to 1.73x the measured throughput)",
          "1.73x", "paired_throughput", rows=("tadm", "adlm"), budget=1, paper_ratio=(1.73,), paper_value=0.73,
          test="TADM / ADLM tokens/s - 1 > 0, and measured / FLOP-bound inside [{claims.speed_bound_lo:g}, "
          "{claims.speed_bound_hi:g}] (t on the timing blocks' df)",
          source="results/throughput.json", covers="timing blocks in separate processes (mean log ratio)",
          n_unit="timing blocks",
          family=PRETRAINING, speed=True,
          paper_bound=f"the paper's 1.73x over its FLOP bound at its settings ({_ADLM_BOUND:.2f}x: d = 768, L = 1024, "
          f"K = 8, tadm.compute) is {1.73 / _ADLM_BOUND:.2f}"),
    Entry("mauve_tadm_gamma0_vs_remdm", "TADM† MAUVE above ReMDM's at T = 2048 (with 25% fewer layer calls than MDLM)",
          "0.650 vs 0.610", "table2_quality", metric="mauve", rows=("tadm_gamma0", "remdm"), budget=2,
          paper_value=0.650 - 0.610, test="MAUVE(TADM†) - MAUVE(ReMDM) > 0",
          source="samples/{{tadm_gamma0,remdm}}, samples/replicates/s*/{{tadm_gamma0,remdm}} (T{T})",
          n_unit="samples per run", family=PRETRAINING),
    Entry("mauve_tadm_vs_remdm", "TADM‡ MAUVE above ReMDM's at T = 2048 (with 25% fewer layer calls than MDLM)",
          "0.646 vs 0.610", "table2_quality", metric="mauve", rows=("tadm", "remdm"), budget=2,
          paper_value=0.646 - 0.610, test="MAUVE(TADM‡) - MAUVE(ReMDM) > 0",
          source="samples/{{tadm,remdm}}, samples/replicates/s*/{{tadm,remdm}} (T{T})", n_unit="samples per run", family=PRETRAINING),
    Entry("genppl_tadm_vs_remdm", "TADM‡ matches or improves on ReMDM in Gen PPL at T = 2048", "21.70 vs 22.8",
          "table2_quality", NON_INFERIORITY, metric="log_ppl", rows=("tadm", "remdm"), budget=2, sign=-1,
          paper_value=math.log(22.8 / 21.70),
          test="log(PPL ReMDM / PPL TADM‡): its {claims.equivalence_level:.0%} interval above -log(1 + "
          "{claims.margin_gen_ppl_rel:g}) (not worse by more than {claims.margin_gen_ppl_rel:.0%})",
          source="samples/{{tadm,remdm}}, samples/replicates/s*/{{tadm,remdm}} (T{T})", n_unit="samples per run", family=PRETRAINING),
    # TADM‡ vs TADM†: anchor supervision is optional
    Entry("gamma_mauve", "TADM‡ (γ = 3e-3) and TADM† (γ = 0) are on par in MAUVE at T = 2048 (anchor supervision "
          "optional)",
          "0.646 vs 0.650", "table2_quality", EQUIVALENCE, metric="mauve", rows=("tadm", "tadm_gamma0"), budget=2,
          paper_value=-0.004, test="‡ - †: {claims.equivalence_level:.0%} interval inside ±{claims.margin_mauve:g}",
          source="samples/{{tadm,tadm_gamma0}} and their replicates (T{T})", n_unit="samples per run", family=PRETRAINING),
    Entry("gamma_gen_ppl", "TADM‡ (γ = 3e-3) and TADM† (γ = 0) are on par in Gen PPL at T = 2048 (anchor supervision "
          "optional)", "21.70 vs 21.77", "table2_quality", EQUIVALENCE, metric="log_ppl", rows=("tadm", "tadm_gamma0"),
          budget=2, paper_value=math.log(21.70 / 21.77),
          test="log(PPL ‡ / PPL †): {claims.equivalence_level:.0%} interval inside "
          "±log(1 + {claims.margin_gen_ppl_rel:g})",
          source="samples/{{tadm,tadm_gamma0}} and their replicates (T{T})", n_unit="samples per run", family=PRETRAINING),
    # --- Table 4: the refresh sweep
    Entry("refresh_tradeoff", "a larger refresh interval K lowers compute at some cost in quality (Table 4 sweep)",
          "compute falls with K, Gen PPL rises", "refresh_sweep", metric="log_ppl",
          test="log(Gen PPL(K = max) / Gen PPL(K = 1)) > 0 (paired), and compute ratio < 1 (counted; else contradicted)",
          source="samples/sweep/K*/tadm", n_unit="samples", rests_on=("tadm",), family=PRETRAINING),
    # --- Sec. 3, Fig. 1: anchor staleness
    Entry("staleness_growth", "a cached anchor goes stale: its prediction drifts from the fresh one as the cache ages",
          "qualitative (Sec. 3)", "staleness_growth", test="KL(fresh || reused) at the largest age / at age 1, minus 1: > 0",
          source="paper_figures/anchor_staleness.csv", covers="trajectory sequences (bootstrap over sequences)",
          n_unit="sequences", rests_on=("tadm",), mechanism=True),
    Entry("fusion_recovery", "the fusion with the current canvas corrects part of the staleness",
          "qualitative (Sec. 3, Fig. 1)", "fusion_recovery",
          test="mean over ages of 1 - KL(fresh || fused) / KL(fresh || stale prediction re-served) > 0",
          source="paper_figures/anchor_staleness.csv", covers="trajectory sequences (bootstrap over sequences)",
          n_unit="sequences", rests_on=("tadm",), mechanism=True),
    # --- Table 1: TADM:Post-train
    Entry("posttrain_throughput", "TADM:Post-train samples faster than its frozen base (+49% to +79% at K = 2, 3)",
          "1.49x-1.79x", "posttrain_throughput", rows=("tadm", "base"), paper_ratio=(1.49, 1.79), paper_value=0.49,
          test="largest K's throughput over base - 1 > 0 (median of paired batch-time ratios; over several tasks their "
          "geometric mean), and measured / FLOP-bound inside [{claims.speed_bound_lo:g}, {claims.speed_bound_hi:g}]",
          source="results/table1.json", covers="timing blocks in separate processes (the scored pass and timing-only blocks)",
          n_unit="timing blocks",
          family=POSTTRAIN, speed=True,
          paper_bound=f"the paper's 1.49x-1.79x over its layer-call bound at K = 3 ({_PT_BOUND:.2f}x: the 2/20/8 split, "
          f"its compute 0.56x) is {1.49 / _PT_BOUND:.2f}-{1.79 / _PT_BOUND:.2f}"),
    Entry("posttrain_accuracy_vs_base", PRESERVES, "Δ -0.84 to +1.11 pts at K = 3 (six benchmarks)", "posttrain_accuracy",
          EQUIVALENCE, metric="accuracy", rows=("tadm", "base"), paper_value=-0.84,
          test="accuracy(TADM, K = max) - accuracy(base): {claims.equivalence_level:.0%} interval inside "
          "±{claims.margin_accuracy_pts:g} pts", source="results/table1.json", n_unit="examples", family=POSTTRAIN),
    Entry("posttrain_accuracy_vs_control", PRESERVES + ": against the fresh-anchor control (the same fusion recipe, anchor "
          "never reused), which isolates anchor reuse", "– (the paper has no control)", "posttrain_accuracy", EQUIVALENCE,
          metric="accuracy", rows=("tadm", "control"),
          test="accuracy(TADM, K = max) - accuracy(control): {claims.equivalence_level:.0%} interval inside "
          "±{claims.margin_accuracy_pts:g} pts", source="results/table1.json", n_unit="examples", family=POSTTRAIN),
    Entry("fusion_vs_{comparator}", "a trained fusion beats training-free reuse at matched layer calls (TADM:Post-train "
          "vs the training-free cache `{comparator}` of claims.training_free_comparator, same base)",
          "qualitative (Sec. 1: existing caches are \"not trained for temporal reuse\")", "training_free",
          metric="accuracy", rows=("tadm",),
          test="accuracy(TADM, K = max) - accuracy({comparator} cache, same K) > 0 (paired)",
          source="results/table1.json", n_unit="examples", family=TRAINING_FREE, per_comparator=True),
    Entry("posttrain_compute", "TADM:Post-train at K = 2 runs 0.67x the base's layer calls (2/20/8 split)", "0.67x",
          "posttrain_layer_calls", CHECK, rows=("tadm", "base"), refresh=2, paper_value=2 / 3,
          test="layer calls K = 2 / base == the split's own bound (counted)", source="results/table1.json"),
)


def entries(catalog: Sequence[Entry], comparators: Sequence[str]) -> list[Entry]:
    """The catalog with each per-comparator entry expanded into one entry per training-free cache
    of `comparators` (params claims.training_free_comparator, in its order), its id filled."""
    out = []
    for e in catalog:
        named = [replace(e, comparator=name, per_comparator=False) for name in comparators] if e.per_comparator else [e]
        out += [replace(x, id=x.id.format(comparator=x.comparator)) for x in named]
    return out


def evaluate(inp: Inputs, catalog: Sequence[Entry] = CATALOG) -> tuple[list[Claim], list[dict]]:
    """Every claim of `catalog` (per-comparator entries expanded: `entries`) with its verdict --
    measured, gated by the preconditions, then decided (`decide`) -- and the preconditions."""
    rules = Rules.of(inp.params)
    out = [measure(e, inp, rules) for e in entries(catalog, inp.params.claims.training_free_comparator)]
    pre = preconditions(inp, out)
    apply_preconditions(out, pre)
    decide(out, rules)
    for c in out:
        c.extra["profile"] = inp.params.profile
        c.extra["mde"], c.extra["n_for_paper"] = mde(c, rules), n_for_paper(c, rules)
    return out, pre


def claims(inp: Inputs, catalog: Sequence[Entry] = CATALOG) -> list[Claim]:
    """Every claim with its verdict (`evaluate`)."""
    return evaluate(inp, catalog)[0]
