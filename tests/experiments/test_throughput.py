"""The throughput stage (tadm.experiments.throughput): every row timed in turns in one process, the
order rotated and reversed between rounds, the timed call the row stages' own draw, ratios the
median of paired per-round ratios, `paired_ratio` what the JSON holds, and Table 2 reading it."""

from __future__ import annotations

import hashlib
import json
import statistics

import numpy as np
import pytest

from tadm import config
from tadm.errors import DataError
from tadm.experiments import table2, tables, throughput
from tadm.experiments.sampling import draw_samples
from tadm.metrics.bootstrap import paired_speedup
from tests.conftest import write_params
from tests.experiments.conftest import random_model, table2_raw

ROWS = ["ar", "mdlm", "mdlm_fb", "adlm", "tadm", "tadm_nofusion"]


@pytest.fixture(scope="module")
def timed(table2_workspace, evaluator_dir, micro_packed, tmp_path_factory):
    """`python -m tadm throughput` on tiny random models (mdlm, tadm, ar from the Table 2
    workspace, and an ADLM), 3 rounds of one 2-sequence batch at the micro budgets."""
    from tadm import cli
    from tadm.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("throughput")
    models = root / "models"
    models.mkdir()
    for kind in ("mdlm", "tadm", "ar"):
        (models / kind).symlink_to(table2_workspace / "models" / kind)
    counts = json.loads((micro_packed / "manifest.json").read_text())["counts"]
    random_model("adlm", counts["vocab_size"], counts["seq_len"], seed=3).save_pretrained(models / "adlm")
    raw = table2_raw(table2_workspace, evaluator_dir, **{"sample.throughput_rounds": 3, "sample.throughput_batch": 2,
                                                          "sample.batch_size": 2})
    params = write_params(root / "params.yaml", raw)
    p = config.load(params)
    # ROWS' other rows (sedd, tadm_gamma0, mdlm_dfm, remdm) have no model here
    assert cli.main(["--params", str(params), "throughput", "--models", str(models), "--rows", *ROWS,
                     "--tokenizer", str(micro_packed.parent / "tokenizer"), "--out", str(root / "throughput.json"),
                     "--table", str(root / "table2_throughput.md")]) == 0
    bos = load_tokenizer(micro_packed.parent / "tokenizer").bos_token_id
    return p, models, root, json.loads((root / "throughput.json").read_text()), bos


def test_rows_are_timed_in_turns_rotating_and_alternating(timed):
    p, _, root, result, _ = timed
    R, n, budgets = 3, len(ROWS), p.sample.steps
    assert result["rows"] == ROWS and result["rounds"] == R and result["batch"] == 2
    assert result["references"] == ["adlm", "mdlm"]
    # round r starts at row r mod n, forward on even rounds, backward on odd ones
    orders = [[ROWS[(r + (1 if r % 2 == 0 else -1) * i) % n] for i in range(n)] for r in range(R)]
    assert orders[0] == ROWS and orders[1][:3] == ["mdlm", "ar", "tadm_nofusion"] and orders[2][0] == "mdlm_fb"
    assert result["schedule"] == [[r, T, row] for r in range(R) for T in budgets for row in orders[r]]
    assert set(result["warmup"]["seconds"]) == set(ROWS)
    for T, K in zip(budgets, p.sample.refresh_every):
        budget = result["budgets"][str(T)]
        assert (budget["T"], budget["K"]) == (T, K)
        assert [rd["order"] for rd in budget["rounds"]] == orders
        for name, row in budget["rows"].items():
            assert row["seconds"] == [rd["seconds"][name] for rd in budget["rounds"]]
            assert row["tokens"] == 2 * p.sample.canvas_length
            assert row["tokens_per_s"] == pytest.approx([row["tokens"] / s for s in row["seconds"]])
            assert row["tokens_per_s_median"] == pytest.approx(statistics.median(row["tokens_per_s"]))
        assert budget["rows"]["tadm_nofusion"]["bypass_fusion"] and not budget["rows"]["tadm"]["bypass_fusion"]
        assert budget["rows"]["tadm"]["policy"] == f"FixedInterval(K={K})"
        assert budget["rows"]["mdlm_fb"]["sampler"] == "mdlm-fb"
    md = (root / "table2_throughput.md").read_text()
    assert table2.ROWS["tadm_nofusion"].label in md and f"T = {budgets[0]}, K = {p.sample.refresh_every[0]}" in md


def test_the_timed_call_is_the_row_stage_draw(timed):
    """Each row's timed tokens are those `draw_samples` gives the row's SampleRun (the row stage's
    first batch when the timing batch is sample.batch_size)."""
    p, models, _, result, bos = timed
    T = p.sample.steps[-1]
    for name in ("tadm_nofusion", "mdlm_fb", "ar"):
        tokens, _ = draw_samples(throughput.sample_run(name, models), p, T, bos_id=bos, num_samples=2)
        digest = hashlib.sha256(np.ascontiguousarray(tokens, np.int64).tobytes()).hexdigest()
        assert result["budgets"][str(T)]["rows"][name]["tokens_sha256"] == digest


def test_paired_ratio_returns_what_the_json_holds(timed):
    _, _, root, _, _ = timed
    result = throughput.load(root / "throughput.json")
    for T, budget in result["budgets"].items():
        rows = budget["rows"]
        for name, row in rows.items():
            for ref in result["references"]:
                stored = row["vs"][ref]
                assert throughput.paired_ratio(result, int(T), name, ref) == (stored["ratio"], stored["se"])
                per_round = [row["tokens_per_s"][i] / rows[ref]["tokens_per_s"][i] for i in range(3)]
                assert stored["ratio"] == pytest.approx(statistics.median(per_round))
            # a reference not stored is computed the same way
            got = throughput.paired_ratio(result, int(T), name, "tadm")
            assert got[0] == pytest.approx(paired_speedup(rows["tadm"]["seconds"], row["seconds"])[0])
        assert throughput.paired_ratio(result, int(T), "adlm", "adlm")[0] == 1.0
    with pytest.raises(KeyError):
        throughput.paired_ratio(result, int(T), "sedd", "adlm")
    with pytest.raises(KeyError):
        throughput.paired_ratio(result, 12345, "tadm", "adlm")


def test_ratios_are_medians_of_paired_per_round_ratios_not_ratios_of_medians():
    budget = {"rows": {"adlm": {"tokens": 100, "seconds": [1.0, 3.0, 2.0]},
                       "tadm": {"tokens": 100, "seconds": [2.0, 1.0, 4.0]},
                       "mdlm": {"tokens": 200, "seconds": [1.0, 1.0, 1.0]}}}
    throughput.summarize(budget)
    tadm, mdlm = budget["rows"]["tadm"], budget["rows"]["mdlm"]
    # per-round tokens/s ratios tadm / adlm: 1/2, 3/1, 2/4 -> median 0.5 (the ratio of the medians is 1)
    assert tadm["vs"]["adlm"]["ratio"] == pytest.approx(0.5)
    assert tadm["tokens_per_s_median"] / budget["rows"]["adlm"]["tokens_per_s_median"] == pytest.approx(1.0)
    assert tadm["vs"]["adlm"]["se"] == pytest.approx(paired_speedup([1.0, 3.0, 2.0], [2.0, 1.0, 4.0])[1])
    # twice the tokens per call: 200/1 against 100/1, 100/3, 100/2 -> 2, 6, 4 -> 4
    assert mdlm["vs"]["adlm"]["ratio"] == pytest.approx(4.0)
    assert budget["rows"]["adlm"]["vs"]["mdlm"]["ratio"] == pytest.approx(0.25)
    assert tadm["tokens_per_s_median"] == pytest.approx(50.0)
    one = {"rows": {"adlm": {"tokens": 1, "seconds": [1.0]}, "tadm": {"tokens": 1, "seconds": [0.5]}}}
    throughput.summarize(one)
    assert one["rows"]["tadm"]["vs"]["adlm"] == {"ratio": 2.0, "se": None}  # JSON has no nan
    assert one["rows"]["tadm"]["tokens_per_s_se"] is None


def test_round_order_rotates_and_alternates():
    rows = list("abcde")
    orders = ["".join(throughput.round_order(rows, r)) for r in range(6)]
    assert orders == ["abcde", "baedc", "cdeab", "dcbae", "eabcd", "aedcb"]  # each row first once per 5 rounds


def test_table2_reads_tokens_per_s_from_the_throughput_stage(tmp_path):
    def row(name, tps):
        return {"row": name, "label": name, "budgets": {"64": {
            "mauve": None, "gen_ppl": None, "entropy": None, "layer_calls": 1, "tokens_per_s": tps, "policy": None,
            "sampler": "mdlm"}}}

    budget = {"T": 64, "K": 8, "rows": {"adlm": {"tokens": 64, "seconds": [1.0, 3.0, 2.0]},
                                        "tadm": {"tokens": 64, "seconds": [2.0, 1.0, 4.0]}}}
    throughput.summarize(budget)
    result = {"format": throughput.FORMAT, "references": ["adlm"], "budgets": {"64": budget}}
    # the row stages' own (unpaired) numbers are not used
    wide = tables.table2_frame([row("adlm", 999.0), row("tadm", 1.0), row("data", None)], result)
    assert wide.loc["TADM‡ (γ=3e-3)", ("throughput_vs_adlm", 64)] == pytest.approx(0.5)
    assert wide.loc["TADM‡ (γ=3e-3)", ("tokens_per_s", 64)] == pytest.approx(32.0)
    assert wide.loc["ADLM", ("throughput_vs_adlm", 64)] == pytest.approx(1.0)
    assert pd_isna(wide.loc["Data", ("tokens_per_s", 64)])
    shown = tables.with_uncertainty(wide)
    assert " ± " in shown.loc["TADM‡ (γ=3e-3)", ("throughput_vs_adlm", 64)]
    metrics = tables.metrics_dict([row("adlm", 999.0), row("tadm", 1.0)], result)
    assert metrics["tadm_T64_throughput_vs_adlm"] == pytest.approx(0.5) and metrics["adlm_T64_tokens_per_s"] < 999
    # a sampling row the throughput stage did not time: an error naming the file, not the row's own number
    with pytest.raises(DataError, match="results/throughput.json has no row 'mdlm' at T=64"):
        tables.table2_frame([row("adlm", 1.0), row("mdlm", 1.0)], result)
    with pytest.raises(DataError, match="missing.*throughput stage") as e:
        tables.read_throughput(tmp_path / "results" / "throughput.json")
    assert str(tmp_path / "results" / "throughput.json") in str(e.value) and "\n" not in str(e.value)


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_a_row_that_does_not_sample_is_refused_in_one_line(timed):
    p, models, _, _, _ = timed
    with pytest.raises(DataError, match="'data' is not a Table 2 row that samples"):
        throughput.run(p, models_dir=models, bos_id=0, rows=["data"], out=None)
