"""The throughput stage (tadm.experiments.throughput): timing blocks in separate processes, each
with its own batch seed and step window, combined on the log scale. In a block every row is timed
in turns in one process at the row stages' batch, the order rotated and reversed between rounds; a diffusion row's timed call
is the same window of whole refresh cycles of its own trajectory every round, resumed from one
paused state (the same for every round, the row stage's real trajectory at step s(T)), every row
over the same number of steps, TADM's refreshes inside it; AR's is its whole draw. Ratios are the
median of paired per-round ratios, beside the FLOP bound; a batch-1 timing beside; `paired_ratio`
and `bound_ratio` read the JSON, and Table 2 reads it."""

from __future__ import annotations

import hashlib
import json
import statistics
import time

import numpy as np
import pytest

from tadm import config, runtime
from tadm.errors import ConfigError, DataError
from tadm.experiments import sampling, table2, tables, throughput, throughput_results
from tadm.metrics.bootstrap import paired_speedup
from tadm.sampling import make_adapter, sample
from tests.conftest import micro_raw, write_params
from tests.experiments.conftest import random_model, table2_raw

ROWS = ["ar", "mdlm", "mdlm_fb", "adlm", "tadm", "tadm_nofusion"]
R, R1, BLOCKS = 3, 2, 2
REFRESH = [2, 4]  # K per budget (T = 8, 16): the window is lcm = 4 steps, two cycles of K = 2 at T = 8


@pytest.fixture(scope="module")
def timed(table2_workspace, evaluator_dir, micro_packed, tmp_path_factory):
    """`python -m tadm throughput --run-blocks` on tiny random models (mdlm, tadm, ar from the
    Table 2 workspace, and an ADLM): 2 blocks, each its own process, of 3 rounds at the micro batch
    (sample.batch_size 2) and 2 at batch 1; the result is block 0's, the combined one is in
    root / "throughput.json"."""
    from tadm import cli
    from tadm.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("throughput")
    models = root / "models"
    models.mkdir()
    for kind in ("mdlm", "tadm", "ar"):
        (models / kind).symlink_to(table2_workspace / "models" / kind)
    counts = json.loads((micro_packed / "manifest.json").read_text())["counts"]
    random_model("adlm", counts["vocab_size"], counts["seq_len"], seed=3).save_pretrained(models / "adlm")
    raw = table2_raw(table2_workspace, evaluator_dir, **{
        "sample.throughput_rounds": R, "sample.throughput_batch": 0, "sample.throughput_batch1_rounds": R1,
        "sample.throughput_blocks": BLOCKS,
        "sample.batch_size": 2, "sample.budgets": [{"T": T, "K": K} for T, K in zip((8, 16), REFRESH)]})
    params = write_params(root / "params.yaml", raw)
    p = config.load(params)
    # ROWS' other rows (sedd, tadm_gamma0, mdlm_dfm, remdm) have no model here
    assert cli.main(["--params", str(params), "throughput", "--run-blocks", "--blocks", str(root / "blocks"),
                     "--models", str(models), "--rows", *ROWS, "--tokenizer", str(micro_packed.parent / "tokenizer"),
                     "--out", str(root / "throughput.json"), "--table", str(root / "table2_throughput.md")]) == 0
    bos = load_tokenizer(micro_packed.parent / "tokenizer").bos_token_id
    return p, models, root, json.loads((root / "blocks" / "block_0.json").read_text()), bos


def sha(tokens) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(tokens), np.int64).tobytes()).hexdigest()


def uninterrupted_canvases(p, models, name, T, batch):
    """The canvas after every step of row `name`'s real trajectory at budget T (the row stage's
    settings and first batch seed, one whole uninterrupted run: no pause involved)."""
    d = runtime.setup(p.runtime)
    spec = throughput.sample_run(name, models)
    model, _ = sampling.prepare_model(sampling.load_pretrained(spec.model_dir), p, d)
    settings = sampling.sampler_settings(spec, p, T, sampling.network_autocast(d))
    refresh = spec.policy(p, T) if model.model_type == "tadm" else None
    canvases = [None]
    with make_adapter(model, refresh, bypass_fusion=spec.bypass_fusion) as adapter:
        sample(adapter, settings, num_samples=batch, seq_len=model.seq_len,
               callback=lambda info: canvases.append(info.z_s.clone()))
    canvases[0] = np.full((batch, model.seq_len), model.mask_id)
    return canvases  # canvases[i]: the canvas before step i


def test_rows_are_timed_in_turns_rotating_and_alternating(timed):
    p, _, root, result, _ = timed
    n, budgets = len(ROWS), p.sample.steps
    assert result["format"] == throughput_results.BLOCK_FORMAT == 2 and (result["block"], result["blocks"]) == (0, BLOCKS)
    assert result["batch_seed"] == p.seed  # block 0: the row stages' first batch
    assert result["rows"] == ROWS and result["rounds"] == R and result["batch"] == p.sample.batch_size == 2
    assert result["references"] == ["adlm", "mdlm"] and result["window"] == 4
    assert result["start_steps"] == {"8": 4, "16": 4}
    # round r starts at row r mod n, forward on even rounds, backward on odd ones
    orders = [[ROWS[(r + (1 if r % 2 == 0 else -1) * i) % n] for i in range(n)] for r in range(R)]
    assert orders[0] == ROWS and orders[1][:3] == ["mdlm", "ar", "tadm_nofusion"] and orders[2][0] == "mdlm_fb"
    # AR's draw does not depend on T: timed once a round, at the first budget, read at every budget
    assert result["schedule"] == [[r, T, row] for r in range(R) for T in budgets for row in orders[r]
                                  if row != "ar" or T == budgets[0]]
    ar = [result["budgets"][str(T)]["rows"]["ar"]["seconds"] for T in budgets]
    assert ar[0] == ar[1] and len(ar[0]) == R
    assert set(result["warmup"]["seconds"]) == set(ROWS)
    for T, K in zip(budgets, REFRESH):
        budget = result["budgets"][str(T)]
        assert (budget["T"], budget["K"]) == (T, K)
        assert [rd["order"] for rd in budget["rounds"]] == orders
        for name, row in budget["rows"].items():
            assert row["seconds"] == [rd["seconds"][name] for rd in budget["rounds"]]
            assert row["tokens"] == 2 * p.sample.canvas_length
            assert row["tokens_per_s"] == pytest.approx([row["tokens"] / (s * row["scale"]) for s in row["seconds"]])
            assert row["tokens_per_s_median"] == pytest.approx(statistics.median(row["tokens_per_s"]))
        assert budget["rows"]["tadm_nofusion"]["bypass_fusion"] and not budget["rows"]["tadm"]["bypass_fusion"]
        assert budget["rows"]["tadm"]["policy"] == f"FixedInterval(K={K})"
        assert budget["rows"]["mdlm_fb"]["sampler"] == "mdlm-fb"
    md = throughput_results.to_markdown(result)
    assert table2.ROWS["tadm_nofusion"].label in md and f"T = {budgets[0]}, K = {REFRESH[0]}" in md
    assert "Batch 1, 2 rounds" in md and "(whole draw)" in md and "timing block 0 of 2" in md
    md = (root / "table2_throughput.md").read_text()
    assert "across 2 timing blocks" in md and "Batch 1, 2 rounds per block" in md and "(whole draw)" in md


def test_every_row_is_timed_over_the_same_steps_from_the_same_state(timed):
    """Each diffusion row's window: the same W steps at every budget, starting from the canvas its
    real (uninterrupted) trajectory has at step s(T), ending where that trajectory is at s + W, and
    the very same in every round."""
    p, models, _, result, _ = timed
    W = result["window"]
    for T in p.sample.steps:
        s = result["start_steps"][str(T)]
        rows = result["budgets"][str(T)]["rows"]
        for name in ROWS[1:]:
            row = rows[name]
            assert row["timed"] == "window" and row["start_step"] == s and row["steps_timed"] == W
            assert row["trajectory_steps"] == T and row["scale"] == T / W
            assert row["counters"]["model_calls"] == W  # ddpm_cache off: one network call per step
            assert row["same_every_round"]
            canvases = uninterrupted_canvases(p, models, name, T, 2)
            assert row["start_sha256"] == sha(canvases[s])
            assert row["tokens_sha256"] == sha(canvases[s + W])
            mask_id = sampling.load_pretrained(throughput.sample_run(name, models).model_dir).mask_id
            assert row["masked_at_start"] == pytest.approx(float((np.asarray(canvases[s]) == mask_id).mean()))


def test_the_anchor_refresh_is_counted_inside_the_timed_window(timed):
    p, _, _, result, _ = timed
    W = result["window"]
    for T, K in zip(p.sample.steps, REFRESH):
        s = result["start_steps"][str(T)]
        rows = result["budgets"][str(T)]["rows"]
        for name in ("tadm", "tadm_nofusion"):
            assert rows[name]["refresh_steps"] == list(range(s, s + W, K))  # where the whole draw refreshes
            assert rows[name]["counters"]["anchor_calls"] == W // K
        assert rows["adlm"]["counters"]["anchor_calls"] == W and rows["mdlm"]["refresh_steps"] is None


def test_a_refresh_costs_inside_the_timed_seconds(timed, monkeypatch):
    """A slowed anchor network slows the timed call by W / K refreshes: the refresh is timed."""
    p, models, _, _, bos = timed
    spec = throughput.sample_run("tadm", models)
    d = runtime.setup(p.runtime)
    model, _ = sampling.prepare_model(sampling.load_pretrained(spec.model_dir), p, d)
    T, K, delay = 8, REFRESH[0], 0.05
    timer = throughput.prepare("tadm", spec, model, p, d, T, 2, 4, 4, bos)
    fast = min(timer.call().seconds for _ in range(3))
    anchor = model.anchor

    def slow(*args, **kwargs):
        time.sleep(delay)
        return anchor(*args, **kwargs)

    monkeypatch.setattr(model, "anchor", slow)
    res = timer.call()
    assert res.counters.anchor_calls == 4 // K
    assert res.seconds >= fast + (4 // K) * delay * 0.9


def test_ar_is_timed_as_its_whole_row_stage_draw(timed):
    p, models, _, result, bos = timed
    for T in p.sample.steps:
        row = result["budgets"][str(T)]["rows"]["ar"]
        assert row["timed"] == "draw" and row["scale"] == 1.0 and row["start_step"] is None
        assert row["steps_timed"] == row["trajectory_steps"] == p.sample.canvas_length - 1
        tokens, _ = sampling.draw_samples(throughput.sample_run("ar", models), p, T, bos_id=bos, num_samples=2)
        assert row["tokens_sha256"] == sha(tokens) and row["same_every_round"]


def test_batch1_is_timed_beside_with_the_same_design(timed):
    p, models, _, result, _ = timed
    one = result["batch1"]
    assert one["batch"] == 1 and one["rounds"] == R1
    orders = [throughput.round_order(ROWS, r) for r in range(R1)]
    assert one["schedule"] == [[r, T, row] for r in range(R1) for T in p.sample.steps for row in orders[r]
                               if row != "ar" or T == p.sample.steps[0]]
    for T in p.sample.steps:
        rows = one["budgets"][str(T)]["rows"]
        assert set(rows) == set(ROWS)
        for name in ROWS[1:]:
            assert rows[name]["tokens"] == p.sample.canvas_length and len(rows[name]["seconds"]) == R1
            assert rows[name]["steps_timed"] == result["window"] and rows[name]["same_every_round"]
            assert rows[name]["start_sha256"] == sha(uninterrupted_canvases(p, models, name, T, 1)[rows[name]["start_step"]])
        got = throughput_results.paired_ratio(result, T, "tadm", "adlm", batch=1)
        assert got == (rows["tadm"]["vs"]["adlm"]["ratio"], rows["tadm"]["vs"]["adlm"]["se"])
        assert got != throughput_results.paired_ratio(result, T, "tadm", "adlm")
        assert throughput_results.batch1_ratio(result, T, "tadm", "adlm") == got
        assert throughput_results.batch1_ratio(result, T, "sedd", "adlm") is None
        assert throughput_results.batch1_ratio({**result, "batch1": None}, T, "tadm", "adlm") is None
    with pytest.raises(KeyError, match="no timing at batch 7"):
        throughput_results.paired_ratio(result, 8, "tadm", "adlm", batch=7)


def test_paired_ratio_and_bound_ratio_return_what_the_json_holds(timed):
    _, _, root, result, _ = timed
    for T, budget in result["budgets"].items():
        rows = budget["rows"]
        for name, row in rows.items():
            for ref in result["references"]:
                stored = row["vs"][ref]
                assert throughput_results.paired_ratio(result, int(T), name, ref) == (stored["ratio"], stored["se"])
                per_round = [row["tokens_per_s"][i] / rows[ref]["tokens_per_s"][i] for i in range(R)]
                assert stored["ratio"] == pytest.approx(statistics.median(per_round))
                bound = throughput_results.bound_ratio(result, int(T), name, ref)
                assert bound == stored["bound"] == pytest.approx(rows[ref]["flops_per_token"] / row["flops_per_token"])
                assert stored["measured_over_bound"] == pytest.approx(stored["ratio"] / bound)
                assert stored["measured_over_bound_se"] == pytest.approx(stored["se"] / bound)
                assert row["flops_per_token"] == pytest.approx(row["counters"]["flops"] * row["scale"] / row["tokens"])
            # a reference not stored is computed the same way
            got = throughput_results.paired_ratio(result, int(T), name, "tadm")
            scaled = [[s * r["scale"] for s in r["seconds"]] for r in (rows["tadm"], row)]
            assert got[0] == pytest.approx(paired_speedup(*scaled)[0])
            assert throughput_results.bound_ratio(result, int(T), name, "tadm") == pytest.approx(
                rows["tadm"]["flops_per_token"] / row["flops_per_token"])
        assert throughput_results.paired_ratio(result, int(T), "adlm", "adlm")[0] == 1.0
        # TADM's FLOPs: 1 denoiser layer every step + 2 anchor layers every K, against ADLM's 2 + 1
        assert throughput_results.bound_ratio(result, int(T), "tadm", "adlm") > 1.0
    with pytest.raises(KeyError):
        throughput_results.paired_ratio(result, int(T), "sedd", "adlm")
    with pytest.raises(KeyError):
        throughput_results.bound_ratio(result, 12345, "tadm", "adlm")


def test_ratios_are_medians_of_paired_per_round_ratios_not_ratios_of_medians():
    budget = {"rows": {"adlm": {"tokens": 100, "seconds": [1.0, 3.0, 2.0], "flops_per_token": 30.0},
                       "tadm": {"tokens": 100, "seconds": [2.0, 1.0, 4.0], "flops_per_token": 20.0},
                       "mdlm": {"tokens": 200, "seconds": [1.0, 1.0, 1.0]}}}
    throughput_results.summarize(budget)
    tadm, mdlm = budget["rows"]["tadm"], budget["rows"]["mdlm"]
    # per-round tokens/s ratios tadm / adlm: 1/2, 3/1, 2/4 -> median 0.5 (the ratio of the medians is 1)
    assert tadm["vs"]["adlm"]["ratio"] == pytest.approx(0.5)
    assert tadm["tokens_per_s_median"] / budget["rows"]["adlm"]["tokens_per_s_median"] == pytest.approx(1.0)
    assert tadm["vs"]["adlm"]["se"] == pytest.approx(paired_speedup([1.0, 3.0, 2.0], [2.0, 1.0, 4.0])[1])
    assert tadm["vs"]["adlm"]["bound"] == pytest.approx(1.5)
    assert tadm["vs"]["adlm"]["measured_over_bound"] == pytest.approx(0.5 / 1.5)
    assert mdlm["vs"]["adlm"]["bound"] is None and mdlm["vs"]["adlm"]["measured_over_bound"] is None
    # twice the tokens per call: 200/1 against 100/1, 100/3, 100/2 -> 2, 6, 4 -> 4
    assert mdlm["vs"]["adlm"]["ratio"] == pytest.approx(4.0)
    assert budget["rows"]["adlm"]["vs"]["mdlm"]["ratio"] == pytest.approx(0.25)
    assert tadm["tokens_per_s_median"] == pytest.approx(50.0)
    one = {"rows": {"adlm": {"tokens": 1, "seconds": [1.0]}, "tadm": {"tokens": 1, "seconds": [0.5]}}}
    throughput_results.summarize(one)
    assert one["rows"]["tadm"]["vs"]["adlm"] == {"ratio": 2.0, "se": None, "bound": None, "measured_over_bound": None,
                                                 "measured_over_bound_se": None}  # JSON has no nan
    assert one["rows"]["tadm"]["tokens_per_s_se"] is None


def test_a_window_stands_for_its_whole_trajectory():
    """Seconds are scaled by trajectory steps / timed steps: a window of 8 of 64 steps taking 1 s
    is a 8 s trajectory; a whole draw (scale 1) of 4 s is faster."""
    budget = {"rows": {"adlm": {"tokens": 64, "seconds": [1.0, 1.0], "scale": 8.0},
                       "ar": {"tokens": 64, "seconds": [4.0, 4.0], "scale": 1.0}}}
    throughput_results.summarize(budget)
    assert budget["rows"]["adlm"]["tokens_per_s_median"] == pytest.approx(8.0)
    assert budget["rows"]["ar"]["vs"]["adlm"]["ratio"] == pytest.approx(2.0)


def test_window_and_start_step():
    assert throughput.window_steps([8, 4]) == 8 and throughput.window_steps([2, 2, 2, 8, 4, 4]) == 8
    assert throughput.window_steps([3, 4]) == 12
    assert [throughput.start_step(T, 8) for T in (8, 12, 16, 64, 128, 4096)] == [0, 0, 8, 8, 8, 8]
    assert [throughput.start_step(T, 4) for T in (4, 8, 16)] == [0, 4, 4]
    with pytest.raises(DataError, match="T=4 is shorter than the timed window of 8 steps"):
        throughput.start_step(4, 8)
    # blocks: the windows past the first spread evenly, the first block at step W, the last at the last window
    assert [throughput.start_step(64, 8, b, 3) for b in range(3)] == [8, 32, 56]
    assert [throughput.start_step(128, 8, b, 3) for b in range(3)] == [8, 64, 120]
    assert [throughput.start_step(16, 8, b, 3) for b in range(3)] == [8, 8, 8]  # one window past the first
    assert [throughput.start_step(8, 8, b, 3) for b in range(3)] == [0, 0, 0]
    assert [throughput.start_step(64, 8, b, 5) for b in range(5)] == [8, 24, 32, 40, 56]
    assert all(throughput.start_step(T, 8, b, B) + 8 <= T and throughput.start_step(T, 8, b, B) % 8 == 0
               for T in (16, 24, 64, 72, 128, 1024) for B in (1, 2, 3, 7) for b in range(B))
    with pytest.raises(DataError, match="block 3 is not one of sample.throughput_blocks=3"):
        throughput.start_step(64, 8, 3, 3)


def test_round_order_rotates_and_alternates():
    rows = list("abcde")
    orders = ["".join(throughput.round_order(rows, r)) for r in range(6)]
    assert orders == ["abcde", "baedc", "cdeab", "dcbae", "eabcd", "aedcb"]  # each row first once per 5 rounds


@pytest.mark.parametrize("key, value, message", [
    ("throughput_rounds", 0, "must be >= 1"), ("throughput_blocks", 0, "must be >= 1"), ("throughput_batch1_rounds", -1, "must be >= 0"),
    ("throughput_batch", -2, "must be >= 0"), ("throughput_batch1_rounds", 2.5, "")])
def test_a_bad_throughput_key_is_refused_in_one_line_naming_it(key, value, message):
    with pytest.raises(ConfigError, match=f"sample.{key}: {message}") as e:
        config.from_dict(micro_raw(**{f"sample.{key}": value}))
    assert "\n" not in str(e.value)


def test_the_timing_batch_defaults_to_the_row_stages_batch():
    p = config.from_dict(micro_raw(**{"sample.batch_size": 3, "sample.throughput_batch": 0}))
    assert throughput.timing_batch(p.sample) == 3
    assert throughput.timing_batch(config.override(p, {"sample.throughput_batch": 5}).sample) == 5


def test_table2_reads_tokens_per_s_from_the_throughput_stage(tmp_path):
    def row(name, tps):
        return {"row": name, "label": name, "budgets": {"64": {
            "mauve": None, "gen_ppl": None, "entropy": None, "layer_calls": 1, "tokens_per_s": tps, "policy": None,
            "sampler": "mdlm"}}}

    budget = {"T": 64, "K": 8, "rows": {"adlm": {"tokens": 64, "seconds": [1.0, 3.0, 2.0], "scale": 2.0},
                                        "tadm": {"tokens": 64, "seconds": [2.0, 1.0, 4.0], "scale": 2.0}}}
    throughput_results.summarize(budget)
    result = {"format": throughput_results.FORMAT, "batch": 64, "references": ["adlm"], "budgets": {"64": budget},
              "batch1": None}
    # the row stages' own (unpaired) numbers are not used
    wide = tables.table2_frame([row("adlm", 999.0), row("tadm", 1.0), row("data", None)], result)
    assert wide.loc["TADM‡ (γ=3e-3)", ("throughput_vs_adlm", 64)] == pytest.approx(0.5)
    assert wide.loc["TADM‡ (γ=3e-3)", ("tokens_per_s", 64)] == pytest.approx(16.0)
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
    (tmp_path / "old.json").write_text(json.dumps({"format": 2}))
    with pytest.raises(DataError, match="has format 2, this tadm reads 3"):
        tables.read_throughput(tmp_path / "old.json")


def test_table2_reads_the_whole_stage_output(timed):
    """Table 2's frame from the JSON the stage wrote: its tokens/s and ratio columns are the stage's."""
    _, _, root, result, _ = timed

    def row(name):
        return {"row": name, "label": name, "budgets": {str(T): {
            "mauve": None, "gen_ppl": None, "entropy": None, "layer_calls": 1, "tokens_per_s": 1.0, "policy": None,
            "sampler": "x"} for T in result["budgets"]}}

    combined = tables.read_throughput(root / "throughput.json")
    wide = tables.table2_frame([row(n) for n in ROWS], combined)
    for T, budget in combined["budgets"].items():
        tadm = budget["rows"]["tadm"]
        assert wide.loc[table2.ROWS["tadm"].label, ("tokens_per_s", int(T))] == tadm["tokens_per_s"]
        assert wide.loc[table2.ROWS["tadm"].label, ("throughput_vs_adlm", int(T))] == tadm["vs"]["adlm"]["ratio"]


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_a_row_that_does_not_sample_is_refused_in_one_line(timed):
    p, models, _, _, _ = timed
    with pytest.raises(DataError, match="'data' is not a Table 2 row that samples"):
        throughput.run(p, models_dir=models, bos_id=0, rows=["data"], out=None)


def test_blocks_run_in_their_own_processes_with_their_own_seed_and_window(timed):
    p, _, root, first, _ = timed
    blocks = throughput_results.load_blocks(root / "blocks")
    assert [b["block"] for b in blocks] == [0, 1] and blocks[0] == first
    assert blocks[1]["batch_seed"] == sampling.batch_seed(p.seed, 1) != blocks[0]["batch_seed"]
    assert blocks[0]["start_steps"] == {"8": 4, "16": 4} and blocks[1]["start_steps"] == {"8": 4, "16": 12}
    # another batch seed: another state to time from
    assert (blocks[0]["budgets"]["8"]["rows"]["tadm"]["start_sha256"]
            != blocks[1]["budgets"]["8"]["rows"]["tadm"]["start_sha256"])


def test_the_combined_ratio_is_the_mean_log_ratio_of_the_blocks(timed):
    from tadm.metrics.invocations import combine

    _, _, root, _, _ = timed
    blocks = throughput_results.load_blocks(root / "blocks")
    result = throughput_results.load(root / "throughput.json")
    assert result["format"] == throughput_results.FORMAT and result["blocks"] == BLOCKS
    for section, batch in ((result, None), (result["batch1"], 1)):
        for T, budget in section["budgets"].items():
            for name, row in budget["rows"].items():
                for ref in result["references"]:
                    per = [throughput_results.paired_ratio(b, int(T), name, ref, batch=batch) for b in blocks]
                    want = combine([r for r, _ in per], [se for _, se in per])
                    got = row["vs"][ref]
                    assert got["ratio"] == pytest.approx(float(np.exp(np.mean(np.log([r for r, _ in per])))))
                    assert got["df"] == BLOCKS - 1 and got["blocks"] == [r for r, _ in per]
                    assert throughput_results.paired_ratio(result, int(T), name, ref, batch=batch) == (want["ratio"], want["se"])
                    if name != ref:  # the blocks' spread on the log scale, never below their rounds' own se
                        var = float(np.var(np.log([r for r, _ in per]), ddof=1))
                        within = float(np.mean([(se / r) ** 2 for r, se in per]))
                        assert got["se"] == pytest.approx(got["ratio"] * np.sqrt(max(var, within) / BLOCKS))
                tps = [b["budgets"][T]["rows"][name]["tokens_per_s_median"] if batch is None
                       else b["batch1"]["budgets"][T]["rows"][name]["tokens_per_s_median"] for b in blocks]
                assert throughput_results.row_tokens_per_s(row)[0] == pytest.approx(float(np.exp(np.mean(np.log(tps)))))
            # a reference not stored: per block, then combined
            got = throughput_results.paired_ratio(result, int(T), "mdlm", "tadm", batch=batch)
            per = [throughput_results.paired_ratio(b, int(T), "mdlm", "tadm", batch=batch) for b in blocks]
            assert got[0] == pytest.approx(combine([r for r, _ in per])["ratio"])


def test_blocks_that_are_not_one_set_are_refused_in_one_line(timed, tmp_path):
    _, _, root, _, _ = timed
    blocks = throughput_results.load_blocks(root / "blocks")
    with pytest.raises(DataError, match=r"holds blocks \[0\] of \[2\]"):
        throughput_results.combine(blocks[:1])
    with pytest.raises(DataError, match="block 1 has batch 5, block 0 2"):
        throughput_results.combine([blocks[0], {**blocks[1], "batch": 5}])
    with pytest.raises(DataError, match="block 1 has format 1"):
        throughput_results.combine([blocks[0], {**blocks[1], "format": 1}])
    with pytest.raises(DataError, match="holds no timing block"):
        throughput_results.load_blocks(tmp_path)
