"""Table 1's training-free cache rows end to end on the tiny workspace: which rows run, and
that the counted (weighted) layer calls are the closed forms of `tadm.caches.budget`."""

from __future__ import annotations

import pytest

from tadm import config
from tests.experiments.conftest import posttrain_raw


def test_cache_rows_run_at_every_k_of_two_or_more_with_their_closed_form_layer_calls(posttrain_workspace, tmp_path):
    from tadm.experiments import table1, table1_render

    p = config.from_dict(posttrain_raw())
    pt = p.posttrain
    results = table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                         out=tmp_path / "table1.json", log=lambda *_: None)
    r = results["tasks"]["arithmetic"]
    rows = r["methods"]
    assert [k for k in rows if not k.startswith(("Base", "Control", "TADM"))] == [
        "Naive reuse K=2", "Naive reuse K=3", "Feature cache K=2", "Feature cache K=3"]  # K = 1 is the base
    batches = -(-r["n"] // pt.eval_batch_size)  # a layer call runs a whole prompt batch's canvases
    generated = pt.sample_steps * batches * len(pt.seeds)  # steps of one canvas per arithmetic batch
    for label, m in rows.items():
        assert m["layer_calls_weighted"] == pytest.approx(m["layer_calls_per_step"] * generated), label
    for k in (2, 3):
        naive, feature, tadm = rows[f"Naive reuse K={k}"], rows[f"Feature cache K={k}"], rows[f"TADM K={k}"]
        assert naive["layer_calls"] == tadm["layer_calls"] == naive["layer_calls_weighted"]
        # layer 0 of each reuse step is whole; the partial layers add their share of the rows
        assert feature["layer_calls"] < feature["layer_calls_weighted"] < tadm["layer_calls"]
        assert 0.0 <= naive["same_output_as_tadm"] <= 1.0 and 0.0 <= feature["same_output_as_tadm"] <= 1.0
    assert "same_output_as_tadm" not in rows["TADM K=2"] and "same_output_as_tadm" not in rows["Base"]
    df = table1_render.frame(results).set_index("method")
    # 1 / 2 / 1 layers, 8-row canvases: the matched share 1/3 floors to 2 of 8 rows, 0.03 below TADM
    assert not df.loc["Feature cache K=2"].matched and df.loc["Naive reuse K=3"].matched
    assert df.loc["Feature cache K=3"].delta_tadm_pts == df.loc["Feature cache K=3"].delta_tadm_pts  # not NaN
    assert df.loc["TADM K=2"].delta_tadm_pts != df.loc["TADM K=2"].delta_tadm_pts  # NaN


def test_no_cache_rows_when_none_are_asked_for(posttrain_workspace, tmp_path):
    from tadm.experiments import table1

    p = config.from_dict(posttrain_raw(**{"posttrain.cache_methods": [], "posttrain.refresh_every": [2]}))
    methods, _ = table1.build_methods(p, posttrain_workspace, control=False)
    assert [m.label for m in methods] == ["Base", "TADM K=2"]
    p = config.from_dict(posttrain_raw(**{"posttrain.cache_methods": ["feature"], "claims.training_free_comparator": ["feature"],
                                          "posttrain.refresh_every": [1, 4],
                                          "posttrain.feature_cache_share": 0.5}))
    methods, _ = table1.build_methods(p, posttrain_workspace, control=False)
    assert [m.label for m in methods] == ["Base", "TADM K=1", "TADM K=4", "Feature cache K=4"]
    assert methods[-1].model.share == 0.5 and methods[-1].base is methods[0].base  # one base for every row


def test_rows_without_a_closed_form_report_their_counted_layer_calls(posttrain_workspace, tmp_path):
    """dKV-Cache's and d²Cache's rules: the rows each step recomputes follow the sampler, so the
    row's calls per step are the ones it counted, its hooks' stock calls plus its partial layers'
    rows / N over the denoising steps it ran."""
    from tadm.experiments import table1

    methods = ["naive", "feature", "dkv", "d2cache"]
    p = config.from_dict(posttrain_raw(**{"posttrain.cache_methods": methods}))
    pt = p.posttrain
    results = table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                         out=tmp_path / "table1.json", log=lambda *_: None, control=False)
    r = results["tasks"]["arithmetic"]
    rows = r["methods"]
    labels = {"dkv": "dKV-Cache-Decode", "d2cache": "d²Cache"}
    counted = [f"{labels[m]} K={k}" for m in methods if m in labels for k in (2, 3)]
    assert counted == ["dKV-Cache-Decode K=2", "dKV-Cache-Decode K=3", "d²Cache K=2", "d²Cache K=3"]
    assert [k for k in rows if not k.startswith(("Base", "TADM", "Naive", "Feature"))] == counted
    batches = -(-r["n"] // pt.eval_batch_size)
    generated = pt.sample_steps * batches * len(pt.seeds)
    layers = sum(results["split"])
    for label in counted:
        m = rows[label]
        assert m["layer_calls_counted"] and m["family"] in labels
        assert m["layer_calls_weighted"] == pytest.approx(m["layer_calls_per_step"] * generated), label
        # every layer of a refresh whole, the reuse steps' layers partly: between the refreshes' calls and the base's
        refreshes = batches * len(pt.seeds) * -(-pt.sample_steps // m["refresh_every"])
        assert m["layer_calls"] == layers * refreshes, label
        assert m["layer_calls"] <= m["layer_calls_weighted"] <= rows["Base"]["layer_calls_weighted"], label
        assert 0.0 <= m["same_output_as_tadm"] <= 1.0
    assert not any(rows[k]["layer_calls_counted"] for k in rows if k not in counted)
