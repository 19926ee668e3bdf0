"""Table 1's fresh-anchor control (issue 15, item 6): the same fusion recipe with the anchor
recomputed at every step. With TADM's own fusion a fresh anchor trains nothing (c == C0 makes
the correction vanish), so a control made by cache_age_probs [1, 0, 0] would be the base
itself; the control's fusion reads the current shallow state and so fine-tunes like TADM does,
and Table 1 reports TADM's delta against it (anchor reuse alone) beside the delta vs the base."""

import json
import math

import numpy as np
import pytest
import torch

from tests.posttrain.conftest import CANVAS
from tests.posttrain.test_posttrain_core import gen_kwargs, prompts
from tests.posttrain.test_posttrain_train import batch, params, step

from tadm.errors import ConfigError, DataError
from tadm.posttrain import model as dgm
from tadm.experiments import table1, table1_render, table1_stats
from tadm.posttrain.objective import Rollout, posttrain_loss


def control_step(ctl, p, b, seed=0):
    rollout = Rollout(p.posttrain.sample_steps, 0.1, (0.8, 0.4), CANVAS, 64)
    loss, logs = posttrain_loss(ctl.split, ctl.fusion, b, torch.Generator().manual_seed(seed), p.posttrain, rollout,
                                fresh=True)
    loss.backward()
    return loss, logs, {n: q.grad.clone() for n, q in ctl.fusion.named_parameters()}


def test_the_fresh_anchor_control_fine_tunes_where_tadms_fusion_cannot(tiny_base):
    p = params(**{"posttrain.cache_age_probs": [1.0, 0.0, 0.0]})  # the anchor is always fresh
    tadm = dgm.build_tadm(tiny_base, p)
    _, logs, grads = step(tadm, p, batch())
    assert logs["age"] == 0 and all(torch.count_nonzero(g) == 0 for g in grads.values())  # TADM: nothing to learn
    ctl = dgm.build_tadm(tiny_base, p, fresh=True)
    assert ctl.fusion.num_parameters == tadm.fusion.num_parameters  # the same size of fusion
    loss, logs, grads = control_step(ctl, p, batch())
    assert torch.isfinite(loss) and logs["age"] == 0
    assert logs["kd"] == pytest.approx(0.0, abs=1e-6)  # zero-initialised up-projection: starts at the base
    assert grads["up.weight"].abs().sum() > 0  # ... and the CE term moves it: the fine-tuning TADM also gets


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_control_draws_the_same_cache_ages_and_rolls_out_with_a_fresh_anchor(tiny_base, seed):
    p = params()  # cache_age_probs (0.34, 0.33, 0.33)
    tadm, ctl = dgm.build_tadm(tiny_base, p), dgm.build_tadm(tiny_base, p, fresh=True)
    _, t_logs, _ = step(tadm, p, batch(), seed)
    loss, c_logs, grads = control_step(ctl, p, batch(), seed)
    assert c_logs["age"] == t_logs["age"] and torch.isfinite(loss)
    assert grads["up.weight"].abs().sum() > 0  # every age trains the control, age 0 included


def test_the_control_at_k1_never_reuses_and_applies_its_fusion_every_step(tiny_base):
    p = params()
    ids = prompts(seed=3)
    torch.manual_seed(5)
    ref = tiny_base.generate(ids, **gen_kwargs()).sequences
    ctl = dgm.build_tadm(tiny_base, p, fresh=True)
    torch.manual_seed(5)
    assert torch.equal(ctl.generate(ids, refresh_every=1, **gen_kwargs()).sequences, ref)  # untrained: the base
    with torch.no_grad():
        for q in ctl.fusion.parameters():
            q.normal_(0, 0.5)
    ctl.reset()
    torch.manual_seed(5)
    out = ctl.generate(ids, refresh_every=1, **gen_kwargs()).sequences
    assert not torch.equal(out, ref)  # a trained control's fusion acts on the fresh anchor
    assert ctl.counters.refreshes == ctl.counters.steps == 12  # and the anchor is recomputed at every step
    tadm = dgm.build_tadm(tiny_base, p)
    tadm.fusion.load_state_dict(ctl.fusion.state_dict())
    torch.manual_seed(5)
    assert torch.equal(tadm.generate(ids, refresh_every=1, **gen_kwargs()).sequences, ref)  # TADM's K = 1: the base


def test_a_control_fusion_is_not_loaded_as_tadms(tmp_path, tiny_base):
    p = params()
    ctl = dgm.build_tadm(tiny_base, p, fresh=True)
    dgm.save_fusion(ctl, tmp_path, "tiny")
    assert json.loads((tmp_path / "fusion.json").read_text())["values"] == "state"
    with pytest.raises(ConfigError, match="values=state"):
        dgm.load_fusion(dgm.build_tadm(tiny_base, p), tmp_path)
    dgm.load_fusion(dgm.build_tadm(tiny_base, p, fresh=True), tmp_path)


def _row(accs, tps=100.0, calls=300, control=False, k=None, family=None, weighted=None, same=0.25, runs=None):
    """Per seed, the first `acc` of 100 examples right; a cache row (naive, feature) wrote TADM's
    completion on a `same` share. A trained row (TADM, control) has its main run and, `runs`,
    the per-seed accuracies of its fusion replicates (seeds 1, 2, ...)."""
    seconds = [100.0 / tps * s for s in (1.0, 1.2, 0.9)]  # three full batches, timed as the base's x 100 / tps
    correct = [[int(i < a) for i in range(100)] for a in accs]
    family = family or ("control" if control else "base" if k is None else "tadm")
    row = {"accuracy": sum(accs) / len(accs), "accuracy_seeds": accs, "accuracy_sd": 1.0, "refresh_every": k,
           "correct_seeds": correct, "seeds": list(range(len(accs))), "family": family,
           "layer_calls_weighted": float(calls if weighted is None else weighted),
           "control": control, "layer_calls": calls, "tokens_per_s": tps, "seconds": seconds,
           "decoder_seconds": [0.9 * s for s in seconds], "flops": 10.0 * calls, "decoder_flops": 9.0 * calls,
           **({"same_output_as_tadm": same} if family in ("naive", "feature") else {})}
    if family in ("tadm", "control"):
        row["runs"] = [{"seed": s, "accuracy": sum(a) / len(a), "accuracy_seeds": a,
                        "seeds": [10 * s + i for i in range(len(a))],  # each run its own sampling seeds
                        "correct_seeds": [[int(i < x) for i in range(100)] for x in a]}
                       for s, a in enumerate([accs, *(runs or [])])]
    return row


def stats(r: dict) -> dict:
    """`r` with every task's statistics over fusion runs, as table1.run writes them."""
    for t in r["tasks"].values():
        table1_stats.add_speedups(t["methods"], "Base")
        t["between_run"] = table1_stats.add_statistics(t["methods"])
    return r


def results(control: bool = True):
    methods = {"Base": _row([20.0, 22.0, 24.0]), table1.CONTROL: _row([30.0, 31.0, 35.0], control=True, k=1),
               "TADM K=1": _row([20.0, 22.0, 24.0], k=1), "TADM K=2": _row([29.0, 31.0, 33.0], 150.0, 200, k=2)}
    if not control:
        del methods[table1.CONTROL]
    return stats({"steps": 12, "canvas_length": 8, "tasks": {"arithmetic": {"n": 10, "methods": methods}}})


def _paired_se(m, ref) -> float:
    """The closed form of the paired bootstrap se: sd of the per-example differences (averaged
    over seeds) / sqrt(n)."""
    d = 100 * (np.asarray(m["correct_seeds"]) - np.asarray(ref["correct_seeds"])).mean(0)
    return d.std(ddof=1) / np.sqrt(len(d))


def test_table1_reports_delta_vs_base_and_vs_the_control_with_their_paired_se():
    r = results()
    methods = r["tasks"]["arithmetic"]["methods"]
    df = table1_render.frame(r).set_index("method")
    assert list(df.index) == ["Base", table1.CONTROL, "TADM K=1", "TADM K=2"]
    k2 = df.loc["TADM K=2"]
    assert k2.delta_pts == pytest.approx(9.0)  # +9 on every seed
    assert k2.delta_se == pytest.approx(_paired_se(methods["TADM K=2"], methods["Base"]), rel=0.15)
    assert k2.delta_control_pts == pytest.approx(-1.0)  # the fine-tuning's share removed: reuse costs 1 point
    assert k2.delta_control_se == pytest.approx(_paired_se(methods["TADM K=2"], methods[table1.CONTROL]), rel=0.15)
    assert df.loc[table1.CONTROL].delta_control_pts == 0 and df.loc["Base"].delta_pts == 0
    assert df.loc["TADM K=1"].delta_se == 0  # the same answers as the base
    md = table1_render.to_markdown(df.reset_index())
    assert "Δ vs control (pts)" in md and f"| -1.0 ± {k2.delta_control_se:.1f} |" in md and "| +9.0 ± " in md
    metrics = table1_render.metrics_dict(df.reset_index())
    assert metrics["arithmetic_TADMK2_delta_control_pts"] == -1.0
    assert metrics["arithmetic_Controlfreshanchor_accuracy"] == pytest.approx(32.0)
    del methods["Base"]["delta_vs_base"]
    with pytest.raises(DataError, match="delta_vs_base"):  # written by an older tadm
        table1_render.frame(r)
    df = table1_render.frame(results(control=False))
    assert df.delta_control_pts.isna().all() and "| – |" in table1_render.to_markdown(df)


def test_the_claims_read_the_same_differences_as_table1(tmp_path):
    """The claims stage recomputes Table 1's accuracy differences from the rows' runs; its effects
    are the table's (replicated TADM and control rows, a cache row at more sampling seeds)."""
    from tadm import config
    from tadm.experiments import claims as C

    p = config.load(config.PROFILES_DIR / "default.yaml")
    r = results()
    methods = r["tasks"]["arithmetic"]["methods"]
    methods["TADM K=2"] = _row([29.0, 31.0, 33.0], 150.0, 200, k=2, runs=[[27.0, 30.0, 30.0], [33.0, 34.0, 32.0]])
    methods[table1.CONTROL] = _row([30.0, 31.0, 35.0], control=True, k=1, runs=[[28.0, 33.0, 31.0], [30.0, 29.0, 32.0]])
    methods["Feature cache K=2"] = _row([28.0, 30.0, 32.0, 26.0, 31.0], 140.0, 200, k=2, family="feature")
    stats(r)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table1.json").write_text(json.dumps(r | {"split": [1, 10, 4]}))
    got = {c.id: c for c in C.claims(C.read_inputs(p, tmp_path))}
    k2, feature = methods["TADM K=2"], methods["Feature cache K=2"]
    assert got["posttrain_accuracy_vs_control"].value == pytest.approx(k2["delta_vs_control"])
    assert got["posttrain_accuracy_vs_base"].value == pytest.approx(k2["delta_vs_base"])
    assert got["fusion_vs_feature"].value == pytest.approx(-feature["delta_vs_tadm"])
    assert got["fusion_vs_naive"].verdict == C.NOT_RUN  # no naive row in this Table 1


def test_the_cli_trains_the_control_and_hands_the_flag_to_torchrun(monkeypatch):
    from tadm import cli, runtime
    from tadm.posttrain import train

    seen = {}
    monkeypatch.setattr(runtime, "relaunch", lambda n, argv: (seen.update(argv=argv), True)[1])
    monkeypatch.setattr(cli.common, "load_params", lambda args: params(**{"runtime.nproc": 2}))
    assert cli.main(["dg-posttrain", "--fresh-anchor"]) == 0
    assert seen["argv"][-3:] == ["--sft", "data/sft", "--fresh-anchor"]
    monkeypatch.setattr(runtime, "relaunch", lambda n, argv: False)
    monkeypatch.setattr(train, "train_fusion", lambda p, **kw: (seen.update(kw=kw), {"run": "stub"})[1])
    assert cli.main(["dg-posttrain", "--fresh-anchor"]) == 0
    assert seen["kw"]["fresh"] is True


def test_throughput_is_the_median_over_full_batches_of_every_seed():
    throughput = table1_stats.throughput
    # two seeds' full batches of 16 prompts and a last, shorter batch of 7 each
    timed = [(16, 2.0, 1.8), (16, 4.0, 3.6), (7, 1.0, 0.9), (16, 3.5, 3.0), (16, 2.5, 2.2), (7, 0.9, 0.8)]
    out = throughput(timed, tokens_per_prompt=32)
    assert out["batch_prompts"] == 16 and out["seconds"] == [2.0, 4.0, 3.5, 2.5]
    assert out["decoder_seconds"] == [1.8, 3.6, 3.0, 2.2]
    assert out["tokens_per_s"] == pytest.approx(16 * 32 / 3.0)  # median of 2.0, 2.5, 3.5, 4.0
    alone = throughput([(3, 1.5, 1.0)], tokens_per_prompt=32)  # a task smaller than one batch
    assert alone["seconds"] == [1.5] and alone["tokens_per_s"] == pytest.approx(3 * 32 / 1.5)


def test_aup_of_each_family_with_two_settings_against_the_leaderboard_formula():
    """Table 1's AUP block: the TADM family (K = 1, 2) is scored, single-setting rows are not; over
    tokens per forward (the same for every row: the score is rho y_1) and over tokens per
    full-model-equivalent forward (rho / compute), against the closed form of the release's rule."""
    df = table1_render.frame(results())
    a = table1_render.aup_frame(df)
    assert list(a.family) == ["tadm"] and a.iloc[0].settings == "K=1/K=2" and a.iloc[0].y_max == pytest.approx(32.0)
    tpf = 8 / 12  # canvas_length / steps
    w = lambda y: min(math.exp(-3.0 * (1 - y / 32.0)), 1.0)  # noqa: E731
    # K = 1: accuracy 22 at rho tpf; K = 2: 31 at 1.5 tpf (two thirds of the base's layer calls)
    assert a.iloc[0].aup_equivalent == pytest.approx(tpf * 22 + 0.5 * tpf * (31 * w(31) + 22 * w(22)) / 2)
    assert a.iloc[0].aup_tpf == pytest.approx(tpf * 22)
    md = table1_render.to_markdown(df)
    assert "| arithmetic | tadm | K=1/K=2 | " in md and "**AUP**" in md
    metrics = table1_render.metrics_dict(df)
    assert metrics["arithmetic_tadm_aup_equivalent"] == pytest.approx(a.iloc[0].aup_equivalent, abs=1e-3)
    r = results()
    del r["canvas_length"]
    with pytest.raises(DataError, match="canvas_length"):  # written by an older tadm
        table1_render.frame(r)


def test_the_table_shows_each_method_s_paired_speed_up():
    # the pairing itself: tests/metrics/test_metrics_bootstrap.py
    df = table1_render.frame(results()).set_index("method")
    assert df.loc["TADM K=2"].throughput_x == pytest.approx(1.5) and df.loc["Base"].throughput_x == 1.0
    assert "| 1.50x ± 0.00x |" in table1_render.to_markdown(df.reset_index())


def test_each_prompt_batch_is_generated_by_every_method_in_turn(tiny_base, monkeypatch):
    """Runner.run_seed: batch by batch, each method in turn (not every batch of one method,
    then the next), so that the times it pairs are seconds apart; and every method counts
    its own decoder-layer calls."""
    p = params(**{"posttrain.eval_batch_size": 2})
    order = []

    class Fake:
        partial_layer_calls = 0.0
        decoder_steps = 0

        def __init__(self, label, layers):
            self.label, self.base, self.layers = label, tiny_base, layers

    def generate_batch(self, method, prompts, max_new_tokens, seed, lo):
        order.append((lo, method.label))
        for _ in range(method.layers):  # what a generation's decoder calls would count
            tiny_base.model.decoder.layers[0](torch.zeros(1))  # one decoder-layer call, seen by the hook
        return [f"{method.label} {lo + k}" for k in range(len(prompts))], 1.0, 0.5

    monkeypatch.setattr(table1.Runner, "generate_batch", generate_batch)
    monkeypatch.setattr(type(tiny_base.model.decoder.layers[0]), "forward", lambda self, *a, **k: None)
    runner = table1.Runner(p, type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0})(), [])
    runner.methods = [Fake("Base", 3), Fake("TADM K=2", 2)]
    task = table1.Task("t", ["a", "b", "c", "d", "e"], lambda i, text: text.startswith("Base"), 8)
    out = runner.run_seed(task, seed=0)
    assert order == [(0, "Base"), (0, "TADM K=2"), (2, "Base"), (2, "TADM K=2"), (4, "Base"), (4, "TADM K=2")]
    assert out["Base"][0] == 100.0 and out["TADM K=2"][0] == 0.0
    assert out["Base"][2] == [True] * 5 and out["TADM K=2"][2] == [False] * 5  # per example, in order
    assert (out["Base"][3], out["TADM K=2"][3]) == (9, 6)  # three batches each, its own calls only
    assert (out["Base"][4], out["TADM K=2"][4]) == (9.0, 6.0)  # no partial layers: weighted = counted
    assert [n for n, _, _ in out["TADM K=2"][5]] == [2, 2, 1]


def test_a_cache_row_is_compared_with_tadm_at_the_same_k_and_marked_when_unmatched():
    r = results()
    methods = r["tasks"]["arithmetic"]["methods"]
    methods["Naive reuse K=2"] = _row([24.0, 26.0, 28.0], 150.0, 200, k=2, family="naive", same=0.8)  # TADM's calls
    methods["Feature cache K=2"] = _row([28.0, 30.0, 32.0], 140.0, 100, k=2, family="feature", weighted=190.0)
    stats(r)
    df = table1_render.frame(json.loads(json.dumps(r, sort_keys=True))).set_index("method")  # as results/table1.json holds it
    assert list(df.index) == ["Base", table1.CONTROL, "TADM K=1", "TADM K=2", "Naive reuse K=2", "Feature cache K=2"]
    naive, feature = df.loc["Naive reuse K=2"], df.loc["Feature cache K=2"]
    assert naive.delta_tadm_pts == pytest.approx(-5.0) and feature.delta_tadm_pts == pytest.approx(-1.0)
    assert naive.delta_tadm_se == pytest.approx(_paired_se(methods["Naive reuse K=2"], methods["TADM K=2"]), rel=0.15)
    assert feature.compute_x == pytest.approx(190 / 300)  # the weighted calls, not the hooks' 100
    assert naive.matched is True and feature.matched is False  # 0.633 vs TADM's 0.667
    assert df.delta_tadm_pts[["Base", table1.CONTROL, "TADM K=1", "TADM K=2"]].isna().all()
    md = table1_render.to_markdown(df.reset_index())
    assert "| -5.0 ± " in md and "(unmatched)" in md and md.count("(unmatched)") == 1
    assert "; 80% same text |" in md and "; 25% same text (unmatched) |" in md
    metrics = table1_render.metrics_dict(df.reset_index())
    assert metrics["arithmetic_NaivereuseK2_delta_tadm_pts"] == -5.0 and "arithmetic_TADMK2_delta_tadm_pts" not in metrics
    assert metrics["arithmetic_NaivereuseK2_same_output_as_tadm"] == 0.8 and "arithmetic_TADMK2_same_output_as_tadm" not in metrics
    del methods["Naive reuse K=2"]["same_output_as_tadm"]
    with pytest.raises(DataError, match="same_output_as_tadm"):
        table1_render.frame(r)
    methods["Naive reuse K=2"]["same_output_as_tadm"] = 0.8
    del methods["Feature cache K=2"]["layer_calls_weighted"]
    with pytest.raises(DataError, match="layer_calls_weighted"):
        table1_render.frame(r)
