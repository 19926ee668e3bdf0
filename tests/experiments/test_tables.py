"""Table formatting: every quality cell with an uncertainty column is shown as "value ± se" in
Markdown (decimals set by the uncertainty), the CSV keeps both as numbers."""

import pandas as pd

from tadm.experiments import tables


def test_markdown_cells_carry_their_uncertainty_and_csv_keeps_numbers(tmp_path):
    results = [{"row": "mdlm", "label": "MDLM", "budgets": {"64": {
        "mauve": 0.6512, "mauve_se": 0.0213, "gen_ppl": 81.234, "gen_ppl_se": 2.5, "entropy": 4.01, "entropy_se": None,
        "layer_calls": 256, "tokens_per_s": 1000.0, "tokens_per_s_se": 12.0, "policy": None, "sampler": "mdlm"}}}]
    timed = {"budgets": {"64": {"rows": {"mdlm": {"tokens_per_s_median": 1000.0, "tokens_per_s_se": 12.0}}}}}
    wide = tables.table2_frame(results, timed)
    shown = tables.with_uncertainty(wide)
    assert shown.loc["MDLM", ("mauve", 64)] == "0.651 ± 0.021"
    assert shown.loc["MDLM", ("gen_ppl", 64)] == "81.2 ± 2.5"
    assert shown.loc["MDLM", ("entropy", 64)] == "4.010"  # no uncertainty: the number alone
    assert ("mauve_se", 64) not in shown.columns
    tables.write_table(wide, tmp_path, "t2")
    assert "0.651 ± 0.021" in (tmp_path / "t2.md").read_text()
    csv = pd.read_csv(tmp_path / "t2.csv", header=[0, 1], index_col=0)
    assert csv.loc["MDLM", ("mauve_se", "64")] == 0.0213


def test_throughput_is_also_shown_relative_to_adlm_at_the_same_budget():
    """From the throughput stage (tests/experiments/test_throughput.py: paired per-round ratios)."""
    from tadm.experiments import throughput_results

    def row(name, tps):
        return {"row": name, "label": name.upper(), "budgets": {str(T): {
            "mauve": None, "gen_ppl": None, "entropy": None, "layer_calls": 1, "tokens_per_s": tps * T / 64,
            "policy": None, "sampler": "mdlm"} for T in (64, 128)}}

    timed = {"budgets": {}}
    for T in (64, 128):
        budget = timed["budgets"][str(T)] = {"rows": {name: {"tokens": 64, "seconds": [64 / (tps * T / 64)] * 3}
                                                      for name, tps in (("adlm", 100.0), ("tadm", 173.0))}}
        throughput_results.summarize(budget)
    wide = tables.table2_frame([row("adlm", 100.0), row("tadm", 173.0), row("data", float("nan"))], timed)
    assert wide.loc["ADLM", ("throughput_vs_adlm", 64)] == 1.0
    assert abs(wide.loc["TADM‡ (γ=3e-3)", ("throughput_vs_adlm", 128)] - 1.73) < 1e-12
    assert pd.isna(wide.loc["Data", ("throughput_vs_adlm", 64)])
