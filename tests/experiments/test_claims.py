"""The claims table: each verdict of each rule on constructed numbers, and claims computed from
result files (nothing typed by hand: change a number, the verdict follows)."""

import json
import math

import numpy as np
import pytest

from tadm import config
from tadm.experiments import claims as C

R = C.Rules()  # z 2, 90 % equivalence interval (1.645 se), power 0.8


def test_direction_gives_each_verdict():
    assert C.direction(0.05, 0.01) == C.REPRODUCED
    assert C.direction(0.01, 0.01) == C.INCONCLUSIVE  # the paper's way, within noise
    assert C.direction(-0.01, 0.01) == C.INCONCLUSIVE  # the other way, within noise: no longer "not reproduced"
    assert C.direction(-0.05, 0.01) == C.CONTRADICTED
    assert C.direction(None, None) == C.NOT_RUN
    assert C.direction(0.05, None) == C.INCONCLUSIVE  # no uncertainty, no verdict


def test_equivalence_is_two_one_sided_tests():
    # the case: -4.6 +- 3.8 points at a 1.5-point margin: the interval (-10.85, 1.65) is
    # neither inside nor outside the margin
    assert C.equivalence(-4.6, 3.8, 1.5) == C.INCONCLUSIVE
    assert C.equivalence(-0.2, 0.5, 1.5) == C.REPRODUCED  # (-1.02, 0.62) inside
    assert C.equivalence(-4.6, 1.0, 1.5) == C.CONTRADICTED  # (-6.2, -2.9) wholly below -1.5
    assert C.equivalence(3.0, 0.5, 1.5) == C.CONTRADICTED
    assert C.equivalence(0.0, 1.0, 1.5) == C.INCONCLUSIVE  # on the nose, but the run cannot tell
    # a difference within 2 se of zero is no longer "on par" by itself: 0.083 +- 0.107 at MAUVE's 0.05
    assert C.equivalence(0.083, 0.107, 0.05) == C.INCONCLUSIVE
    assert C.equivalence(None, 1.0, 1.5) == C.NOT_RUN


def test_non_inferiority_is_the_one_sided_half():
    m = math.log(1.05)
    assert C.non_inferiority(0.02, 0.01, m) == C.REPRODUCED  # better
    assert C.non_inferiority(-0.02, 0.01, m) == C.REPRODUCED  # 2 % worse, surely under 5 %
    assert C.non_inferiority(-0.07, 0.03, m) == C.INCONCLUSIVE
    assert C.non_inferiority(-0.2, 0.03, m) == C.CONTRADICTED


def test_magnitude_needs_the_direction_and_the_paper_s_figure():
    assert C.magnitude(1.8, 0.05, 1.0, 1.73) == C.REPRODUCED  # 1.73 inside the interval
    assert C.magnitude(2.06, 0.09, 1.0, 1.73) == C.REPRODUCED  # larger than the paper's
    assert C.paper_position(2.06, 0.09, 1.73).startswith("below the interval")
    assert C.magnitude(1.3, 0.05, 1.0, 1.73) == C.CONTRADICTED  # faster, but short of 1.73 beyond noise
    assert C.paper_position(1.3, 0.05, 1.73).startswith("above the interval")
    assert C.magnitude(1.5, 0.2, 1.0, 1.73) == C.REPRODUCED  # 1.1 .. 1.9 reaches 1.73
    assert C.magnitude(1.2, 0.3, 1.0, 1.73) == C.INCONCLUSIVE  # 0.6 .. 1.8: not faster beyond noise
    assert C.magnitude(0.7, 0.05, 1.0, 1.73) == C.CONTRADICTED
    assert C.paper_position(1.6, 0.1, 1.49, 1.79) == "inside the interval"


def test_checks_are_exact_and_not_findings():
    assert C.exact(0.75, 0.75) == C.PASS and C.exact(0.8, 0.75) == C.FAIL and C.exact(None, 0.75) == C.NOT_RUN
    cs = [C.Claim("a", "a", "", C.CHECK, verdict=C.PASS), C.Claim("b", "b", "", C.DIRECTION, verdict=C.REPRODUCED)]
    assert C.tally(cs)[C.REPRODUCED] == 1 and sum(C.tally(cs).values()) == 1


def test_minimum_detectable_effect_and_the_n_for_the_paper_s_effect():
    c = C.Claim("x", "x", "", C.DIRECTION, value=0.0, se=0.1, paper_value=0.04, n=256)
    z = 2 + 0.8416
    assert C.mde(c, R) == pytest.approx(z * 0.1, rel=1e-3)
    assert C.n_for_paper(c, R) == math.ceil(256 * (z * 0.1 / 0.04) ** 2)
    e = C.Claim("y", "y", "", C.EQUIVALENCE, value=0.0, se=1.0, paper_value=-1.1, margin=1.5, n=87)
    assert C.mde(e, R) == pytest.approx(1.6449 + 0.8416, rel=1e-3)
    assert C.n_for_paper(e, R) == math.ceil(87 * ((1.6449 + 0.8416) / 0.4) ** 2)
    assert C.n_for_paper(C.Claim("z", "z", "", C.EQUIVALENCE, se=1.0, paper_value=-2.0, margin=1.5, n=9), R) is None


# --------------------------------------------------------------------------- from result files


def _cell(mauve, gen_ppl, layer_calls, tps, se=0.01):
    return {"mauve": mauve, "mauve_se": se, "gen_ppl": gen_ppl, "gen_ppl_se": 1.0, "entropy": 4.0, "entropy_se": 0.01,
            "layer_calls": layer_calls, "tokens_per_s": tps, "tokens_per_s_se": 1.0, "policy": None}


N = 64


def _scores(root, row, T, shift, ppl, seed):
    """Per-sample scores of a row: features drawn around the shared references shifted by
    `shift` (a larger shift, a lower MAUVE), per-sample NLL giving Gen PPL ~ `ppl`."""
    rng = np.random.default_rng(seed)
    d = root / "samples" / row
    d.mkdir(parents=True, exist_ok=True)
    ref = np.random.default_rng(123).normal(size=(N, 4)).astype(np.float32)
    np.save(d / "reference_features.npy", ref)
    np.save(d / f"T{T}_features.npy", (rng.normal(size=(N, 4)) + shift).astype(np.float32))
    tokens = np.full(N, 60.0)
    nll = np.log(ppl) * tokens * (1 + 0.01 * rng.normal(size=N))
    np.save(d / f"T{T}_gen_ppl.npy", np.stack([nll, tokens], 1))


@pytest.fixture
def run_dir(tmp_path):
    """A run of the default profile's shape: L = 64, T = 64 (K = 8) and 128 (K = 4)."""
    p = config.override(config.load(config.PROFILES_DIR / "default.yaml"),
                        {"sample.canvas_length": 64, "sample.block_size": 64, "packing.seq_len": 64,
                         "sample.steps": [64, 128], "sample.refresh_every": [8, 4], "eval.bootstrap": 20})
    rows = {"mdlm": (0.1, 80.0, 6, 100.0), "remdm": (0.3, 60.0, 6, 100.0), "adlm": (0.5, 50.0, 9, 60.0),
            "tadm": (0.4, 55.0, None, 120.0), "tadm_gamma0": (0.41, 56.0, None, 120.0)}
    shifts = {"remdm": 1.5, "tadm": 0.0, "tadm_gamma0": 0.0}
    (tmp_path / "results/table2").mkdir(parents=True)
    for i, (row, (m, g, layers, tps)) in enumerate(rows.items()):
        budgets = {}
        for T, K in ((64, 8), (128, 4)):
            calls = T * 3 + -(-T // K) * 6 if layers is None else T * layers
            budgets[str(T)] = _cell(m, g, calls, tps)
            if row in shifts:
                _scores(tmp_path, row, T, shifts[row], g, seed=i)
        (tmp_path / f"results/table2/{row}.json").write_text(json.dumps({"row": row, "label": row, "budgets": budgets}))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/compute_column.json").write_text(json.dumps(
        {"T1024_mdlm": 12288, "T1024_tadm": 7680, "T2048_mdlm": 24576, "T2048_tadm": 18432}))
    return p, tmp_path


def test_claims_follow_the_numbers(run_dir):
    p, root = run_dir
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    for cid in ("compute_T2L", "compute_T1L", "compute_T2L_paper_depths", "compute_T1L_paper_depths"):
        assert not got[cid].finding and got[cid].verdict == C.PASS, cid
    assert got["compute_T1L_paper_depths"].value == pytest.approx(0.625)
    # TADM's samples sit on the references, ReMDM's 1.5 sd away: MAUVE far above, beyond the
    # paired se even with the training-run allowance
    up = got["mauve_tadm_gamma0_vs_remdm"]
    assert up.value > 0.5 and up.verdict == C.REPRODUCED and "training run" in up.covers and up.n == N
    # the two TADMs: the same distribution, but 64 samples cannot show a 0.05 margin
    assert got["gamma_mauve"].verdict == C.INCONCLUSIVE
    assert got["genppl_tadm_vs_remdm"].verdict == C.REPRODUCED  # 55 vs 60: better
    assert got["genppl_tadm_vs_remdm"].value == pytest.approx(math.log(60 / 55), abs=0.03)
    # nothing produced for these at this run: said so, never guessed
    for cid in ("throughput_vs_adlm", "refresh_tradeoff", "staleness_growth", "fusion_recovery",
                "posttrain_throughput", "posttrain_accuracy"):
        assert got[cid].verdict == C.NOT_RUN, cid


def test_the_paired_se_is_smaller_than_quadrature_of_shared_references(run_dir):
    """Both rows are scored against one reference set: the se of their MAUVE difference comes
    from resamples that share the references, not from adding the two cells' variances."""
    from tadm.metrics.bootstrap import mauve_se, paired_mauve_diff
    from tadm.experiments.table2 import load_paired

    p, root = run_dir
    a, b = load_paired(root / "samples/tadm", 128), load_paired(root / "samples/tadm_gamma0", 128)
    diff, se = paired_mauve_diff(a["reference"], a["features"], b["features"], 30)
    quad = math.hypot(mauve_se(a["reference"], a["features"], 30), mauve_se(a["reference"], b["features"], 30))
    assert math.isfinite(se) and se < quad


def test_a_worse_tadm_flips_the_verdict_and_the_files_are_written(run_dir):
    p, root = run_dir
    _scores(root, "tadm_gamma0", 128, 6.0, 56.0, seed=9)  # now much further from the references than ReMDM
    p = config.override(p, {"claims.training_sd_mauve": 0.0})  # the same training run, say
    cs = C.write(p, root, out=root / "paper_figures")
    assert {c.id: c.verdict for c in cs}["mauve_tadm_gamma0_vs_remdm"] == C.CONTRADICTED
    md = (root / "paper_figures/claims.md").read_text()
    assert "## Findings" in md and "## Implementation checks (4 of 5 pass; not findings)" in md
    assert "contradicted" in md and "0.75x" in md and "two one-sided tests" in md
    assert md.index("Rules, fixed before any number is read") < md.index("| claim |")
    head = (root / "paper_figures/claims.csv").read_text().splitlines()[0]
    assert head.startswith("id,part,claim,paper,this_run") and ",mde,n_for_paper," in head
    summary = (root / "paper_figures/claims_summary.md").read_text()
    assert "| finding | paper | this run | verdict |" in summary and "0.75x" not in summary  # checks are not findings


def test_a_budget_the_profile_does_not_sample_is_not_run(run_dir):
    p, root = run_dir
    p = config.override(p, {"sample.steps": [64], "sample.refresh_every": [8]})
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    assert got["compute_T2L"].verdict == C.NOT_RUN and got["mauve_tadm_vs_remdm"].verdict == C.NOT_RUN
    assert got["compute_T1L"].verdict == C.PASS


def _train(root, name, val, below, model_type="mdlm"):
    (root / "metrics/train").mkdir(parents=True, exist_ok=True)
    (root / f"metrics/train/{name}.json").write_text(json.dumps(
        {"val_nelbo": val, "unigram_entropy": val + below, "below_unigram": below, "model_type": model_type}))


def _evaluator(root, val_nll, ratio=6.0):
    from tadm.metrics.trained_evaluator import THRESHOLDS

    sanity = {"mauve_data_data": 0.95, "mauve_data_shuffled": 0.01, "shuffled_ppl_ratio_per_gpt2_token": ratio,
              "shuffled_ppl_ratio": 2.1, "shuffled_ppl_ratio_per_word": 13.0, "judge_tokens": 900, "gpt2_tokens": 400,
              "words": 250, "gen_ppl_data": 13.0, "gen_ppl_shuffled": 27.3}
    passed = {k: (sanity[k] >= v if op == ">=" else sanity[k] <= v) for k, (op, v) in THRESHOLDS.items()}
    (root / "metrics/evaluator.json").write_text(json.dumps(
        {"sanity": sanity, "sanity_thresholds": {k: f"{op} {v}" for k, (op, v) in THRESHOLDS.items()},
         "sanity_passed": passed} | ({} if val_nll is None else {"val_nll": val_nll})))


def test_a_judge_weaker_than_a_model_it_judges_makes_its_findings_not_testable(run_dir):
    p, root = run_dir
    for name in ("mdlm", "tadm", "tadm_gamma0"):
        _train(root, name, 2.9, 1.3)
    _train(root, "ar", 2.33, 1.9, "ar")
    _evaluator(root, 2.44)  # the judge: weaker than the AR model
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    for cid in ("mauve_tadm_vs_remdm", "genppl_tadm_vs_remdm", "gamma_mauve", "gamma_gen_ppl"):
        assert got[cid].verdict == C.NOT_TESTABLE and "judge" in got[cid].notes, cid
    assert got["compute_T2L"].verdict == C.PASS  # checks do not need the judge
    _evaluator(root, 2.20)
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    assert got["mauve_tadm_gamma0_vs_remdm"].verdict == C.REPRODUCED
    _evaluator(root, 2.20, ratio=4.0)  # a judge deaf to word order in Gen PPL: only the Gen PPL findings fall
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    assert got["genppl_tadm_vs_remdm"].verdict == C.NOT_TESTABLE and "shuffled_ppl_ratio" in got["genppl_tadm_vs_remdm"].notes
    assert got["mauve_tadm_gamma0_vs_remdm"].verdict == C.REPRODUCED
    _evaluator(root, 2.20)
    _train(root, "tadm", 3.9, 0.4)  # TADM above its quality line: its findings cannot be tested
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    assert got["mauve_tadm_vs_remdm"].verdict == C.NOT_TESTABLE and "tadm:" in got["mauve_tadm_vs_remdm"].notes
    assert got["mauve_tadm_gamma0_vs_remdm"].verdict == C.REPRODUCED


def test_the_evaluator_checks_are_the_thresholded_ones_and_the_ratio_shows_its_units(run_dir):
    p, root = run_dir
    from tadm.metrics.trained_evaluator import THRESHOLDS

    _evaluator(root, None, ratio=4.9)
    rows = {r["check"]: r for r in C.preconditions(C.read_inputs(p, root)) if r["check"].startswith("evaluator")}
    assert set(rows) == {f"evaluator: {k}" for k in THRESHOLDS}
    ratio = rows["evaluator: shuffled_ppl_ratio_per_gpt2_token"]
    assert ratio["passed"] is False and ratio["wanted"] == ">= 5.0"
    assert ratio["shown"] == "4.900 (per judge token: 2.100, 900 judge tokens for 400 GPT-2 tokens)"


def _staleness(root, kl_reused, kl_fused, kl_bypass, growth_se=0.5, rec_se=0.01):
    (root / "paper_figures").mkdir(exist_ok=True)
    cols = ["age", "sequences", "kl_fused", "kl_reused", "kl_bypass", "recovery", "recovery_vs_reused", "kl_fused_se",
            "kl_reused_se", "kl_bypass_se", "recovery_se", "growth_reused", "growth_reused_se", "recovery_mean_se"]
    lines = [",".join(cols)]
    for age in range(0, 9):
        r, f, b = kl_reused(age), kl_fused(age), kl_bypass(age)
        rec = "" if age == 0 else 1 - f / b
        old = "" if age == 0 or r == 0 else 1 - f / r
        growth = "" if age == 0 else (r / kl_reused(1) if kl_reused(1) > 0 else math.inf)
        lines.append(",".join(map(str, [age, 16, f, r, b, rec, old, f / 10, r / 10, b / 10, rec_se, growth, growth_se, rec_se])))
    (root / "paper_figures/anchor_staleness.csv").write_text("\n".join(lines) + "\n")


def test_staleness_uses_the_per_sequence_se_and_recovery_is_against_the_bypass(run_dir):
    p, root = run_dir
    _staleness(root, lambda a: 0.01 * a, lambda a: 0.001 * a, lambda a: 0.5 + 0.002 * a)
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    grow, rec = got["staleness_growth"], got["fusion_recovery"]
    assert grow.value == pytest.approx(7.0) and grow.se == 0.5 and grow.verdict == C.REPRODUCED and grow.n == 16
    assert rec.value == pytest.approx(np.mean([1 - 0.001 * a / (0.5 + 0.002 * a) for a in range(1, 9)]))
    assert rec.verdict == C.REPRODUCED and "against re-serving the stale prediction: 0.900" in rec.shown
    # growth within its per-sequence noise: inconclusive, not "reproduced"
    _staleness(root, lambda a: 0.01 * (1 + 0.01 * a), lambda a: 0.001, lambda a: 0.5, growth_se=0.2)
    assert {c.id: c for c in C.claims(C.read_inputs(p, root))}["staleness_growth"].verdict == C.INCONCLUSIVE
    # a CSV from before the per-sequence columns: not run, with the reason
    (root / "paper_figures/anchor_staleness.csv").write_text("age,kl_fused,kl_reused,recovery\n0,0,0,\n1,1,2,0.5\n2,1,3,0.6\n")
    got = {c.id: c for c in C.claims(C.read_inputs(p, root))}
    assert got["staleness_growth"].verdict == C.NOT_RUN and "rerun dvc repro staleness" in got["staleness_growth"].notes
