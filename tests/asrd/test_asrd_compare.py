"""The comparison's rows and sweeps: the matched low-confidence + threshold + TADM row, the
one-at-a-time sweeps of capacity, window and block size, and their tables."""

import dataclasses
import math

import pytest

from tadm import config
from tadm.experiments.asrd import compare
from tadm.asrd.tasks import TaskSet


@pytest.fixture(scope="module")
def params():
    return config.from_dict(config.render_profile("default"))


def test_the_matched_row_is_asrd_on_tadm_without_asrds_mechanisms(params):
    rows = {v.label: v for v in compare.variants(params, params.asrd.dg_steps, time_anchored=True)}
    k = params.asrd.refresh_every
    asrd, matched = rows[f"ASRD + TADM K={k}"], rows[f"Low-confidence + threshold + TADM K={k}"]
    assert matched.refresh_every == asrd.refresh_every == k and asrd.base == matched.label
    # identical settings but ASRD's: the method and its two mechanisms
    assert matched.settings == asrd.settings.replace(method="low-confidence", guidance=0.0, perturbation=0.0)
    assert matched.settings.threshold == params.asrd.threshold
    assert rows["ASRD"].base == compare.ASRD_BASE and rows[compare.ASRD_BASE].settings == matched.settings
    assert rows["ASRD"].settings == asrd.settings
    labels = [v.label for v in compare.variants(params, params.asrd.steps, time_anchored=False)]
    assert not any("TADM" in label for label in labels)


def test_the_sweeps_move_one_setting_at_a_time_around_the_default(params):
    a = params.asrd
    points = compare.sweep_points(params)
    by = {(pt.sweep, pt.value): pt for pt in points}
    assert sorted(v for s, v in by if s == "capacity") == [12, 16, 20]
    assert sorted(v for s, v in by if s == "window") == [1, 2, 4]
    assert sorted(v for s, v in by if s == "block_size") == [4, 8, 12, 24]
    default = points[0].default
    assert (default.capacity, default.window, default.block_size) == (a.capacity, a.window, a.block_size)
    for pt in points:
        field = pt.sweep
        changed = {f.name for f in dataclasses.fields(default) if getattr(pt.asrd, f.name) != getattr(default, f.name)}
        assert changed <= {field} and getattr(pt.asrd, field) == pt.value
        assert pt.is_default == (pt.value == getattr(default, field))
        assert pt.base.method == "low-confidence" and pt.base.block_size == pt.asrd.block_size
        assert pt.base == pt.asrd.replace(method="low-confidence", guidance=0.0, perturbation=0.0,
                                          capacity=default.capacity, window=default.window)


class _Runner:
    """Records what the sweeps decode; every setting scores its capacity as accuracy."""

    def __init__(self):
        self.decoded = []

    def backend(self, refresh_every):
        assert refresh_every == 1
        return object()

    def run(self, backend, task, settings, tally):
        self.decoded.append((task.name, len(task), settings))
        tally.batch_seconds, tally.tokens, tally.batches, tally.sequences = [1.0], 10, 1, len(task)
        tally.calls, tally.verified, tally.remasked = settings.block_size, 3, 1
        return float(settings.capacity if settings.method == "asrd" else 1)


def _task(name, n):
    return TaskSet(name, [f"p{i}" for i in range(n)], [f"r{i}" for i in range(n)], [f"a{i}" for i in range(n)])


def test_the_sweeps_decode_each_distinct_setting_once_with_the_first_seed_on_a_subset(params):
    p = config.override(params, {"asrd.sweep_examples": 5, "asrd.seeds": [7, 8]})
    runner = _Runner()
    out = compare.run_sweeps(p, runner, {"arithmetic": _task("arithmetic", 9), "spelling": _task("spelling", 3)},
                             log=lambda *_: None)
    assert out["seed"] == 7 and out["examples"] == 5
    # per task: 3 + 3 + 4 ASRD points, of which the default three times (2 new + 2 new + 3 new + 1),
    # and the base at each of the 4 block sizes
    per_task = 8 + 4
    assert len(runner.decoded) == 2 * per_task
    assert {(name, n) for name, n, _ in runner.decoded} == {("arithmetic", 5), ("spelling", 3)}
    assert all(s.seed == 7 for *_, s in runner.decoded)
    df = compare.sweep_frame({"sweeps": out})
    assert len(df) == 2 * 10 and df.default.sum() == 2 * 3
    cap = df[(df.sweep == "capacity") & (df.task == "arithmetic")]
    assert cap.accuracy.tolist() == [12.0, 16.0, 20.0] and cap.delta_base_pts.tolist() == [11.0, 15.0, 19.0]
    md = compare.sweep_markdown(df)
    assert md.count("\n") == 2 + 20 and "| arithmetic | capacity | 16* |" in md
    assert "one seed (7)" in compare.sweep_caption(p, {"sweeps": out}) and "first 5" in compare.sweep_caption(p, {"sweeps": out})


def test_no_sweep_values_means_no_sweeps(params):
    p = config.override(params, {"asrd.sweep_capacity": [], "asrd.sweep_window": [], "asrd.sweep_block_size": []})
    runner = _Runner()
    out = compare.run_sweeps(p, runner, {"arithmetic": _task("arithmetic", 2), "spelling": _task("spelling", 2)})
    assert out["points"] == [] and runner.decoded == [] and compare.sweep_frame({"sweeps": out}).empty


def _row(acc, base=None, batch_seconds=(1.0, 2.0, 1.5)):
    return {"accuracy": acc, "accuracy_sd": 0.0, "tokens_per_s": 100.0, "calls_per_batch": 3.0,
            "layer_calls_per_batch": 12.0, "remasked_per_sequence": 0.5,
            "verified_per_sequence": 2.0, "base": base, "batch_seconds": list(batch_seconds)}


def test_the_table_reads_each_asrd_row_against_its_own_base():
    methods = {compare.BASELINE: _row(10.0), compare.ASRD_BASE: _row(12.0), "ASRD": _row(15.0, compare.ASRD_BASE),
               "Low-confidence + threshold + TADM K=2": _row(20.0),
               "ASRD + TADM K=2": _row(19.0, "Low-confidence + threshold + TADM K=2")}
    df = compare.frame({"groups": [{"task": "arithmetic", "model": "diffusiongemma", "methods": methods}]})
    got = dict(zip(df.method, df.delta_base_pts))
    assert got["ASRD"] == 3.0 and got["ASRD + TADM K=2"] == -1.0 and math.isnan(got[compare.BASELINE])
    md = compare.to_markdown(df)
    assert "| ASRD + TADM K=2 | 19.0 ± 0.0 | +9.0 | -1.0 |" in md and "| +0.0 | — |" in md
    # the speed-up pairs each batch with the baseline's: a machine twice as slow on batch 2 cancels
    methods["ASRD"]["batch_seconds"] = [0.5, 1.0, 0.75]
    df = compare.frame({"groups": [{"task": "arithmetic", "model": "diffusiongemma", "methods": methods}]})
    got = dict(zip(df.method, zip(df.speedup_x, df.speedup_se)))
    assert got["ASRD"] == (pytest.approx(2.0), pytest.approx(0.0)) and got[compare.BASELINE][0] == 1.0
    assert "| 2.00x ± 0.00x |" in compare.to_markdown(df)


def test_methods_take_turns_on_every_batch_and_each_keeps_its_own_tally():
    """Batches.run_interleaved: batch 1 by every method, then batch 2, ... (so a slow stretch
    of the machine hits every method alike); each method's counters, time and accuracy stay
    its own, and the single-method `run` is the same decoding."""
    import torch

    from tadm import runtime
    from tadm.asrd.backends import DecodeCounters
    from tadm.asrd.decode import DecodeResult

    order = []

    class Batches(compare.Batches):
        dist, batch = runtime.Dist(), 2

    def decoder(name, calls, seconds):
        def decode_batch(lo):
            order.append((lo, name))
            n = min(2, 5 - lo)
            counters = DecodeCounters(calls=calls)
            result = DecodeResult(tokens=torch.zeros(n, 4, dtype=torch.long), counters=counters, steps=4, remasked=0,
                                  verified=0, seconds=seconds, settings=None)
            return result, [name] * n, 4 * n
        return decode_batch

    task = TaskSet("spelling", [f"q{i}" for i in range(5)], ["a"] * 5, ["a"] * 5)  # "a" is right, "b" wrong
    runner = Batches()
    tallies = [compare.Tally(), compare.Tally()]
    accs = runner.run_interleaved(task, [(decoder("a", 3, 1.0), tallies[0]), (decoder("b", 1, 0.5), tallies[1])])
    assert order == [(0, "a"), (0, "b"), (2, "a"), (2, "b"), (4, "a"), (4, "b")]
    assert [t.calls for t in tallies] == [9, 3] and [t.seconds for t in tallies] == [3.0, 1.5]
    assert [t.tokens for t in tallies] == [20, 20] and [t.batches for t in tallies] == [3, 3]
    assert tallies[0].batch_seconds == [1.0] * 3 and tallies[1].batch_seconds == [0.5] * 3
    assert tallies[0].examples == ["a"] * 5 and tallies[1].examples == ["b"] * 5
    order.clear()
    alone = compare.Tally()
    runner.decoder = lambda backend, task, settings: decoder("b", 1, 0.5)
    runner.run(None, task, None, alone)
    assert order == [(0, "b"), (2, "b"), (4, "b")] and alone.calls == 3
    assert accs == [100.0, 0.0]


def test_each_method_at_two_settings_or_more_gets_its_aup_over_both_axes(params):
    """ASRD and its base, with and without TADM's anchor reuse, are one family each (the variants
    say so); AUP is the leaderboard's formula over (tokens per forward, accuracy) and over tokens
    per full-model-equivalent forward, the layers of one full call read off the low-confidence row."""
    from tadm.metrics.aup import aup

    rows = {v.label: v for v in compare.variants(params, params.asrd.dg_steps, time_anchored=True)}
    K = params.asrd.refresh_every
    assert rows[f"ASRD + TADM K={K}"].family == "ASRD" and rows[f"{compare.ASRD_BASE} + TADM K={K}"].family == compare.ASRD_BASE
    assert rows["ASRD"].family is None  # the row alone: its label (`run` records `family or label`)

    def row(acc, tokens, calls, layer_calls, family):
        return {**_row(acc), "tokens_per_batch": tokens, "calls_per_batch": calls, "layer_calls_per_batch": layer_calls,
                "layer_calls_weighted_per_batch": layer_calls, "family": family}

    methods = {compare.BASELINE: row(20.0, 96, 24.0, 96.0, compare.BASELINE),  # 4 layers a call
               "ASRD": row(22.0, 96, 12.0, 48.0, "ASRD"),
               f"ASRD + TADM K={K}": row(24.0, 96, 12.0, 30.0, "ASRD"),  # the anchor reused: fewer layers a call
               "Plain": row(10.0, 96, 24.0, 96.0, "Plain")}
    a = compare.aup_frame({"groups": [{"task": "arithmetic", "model": "diffusiongemma", "methods": methods}]})
    assert list(a.family) == ["ASRD"] and a.settings[0] == f"ASRD / ASRD + TADM K={K}" and a.y_max[0] == 24.0
    assert a.aup_tpf[0] == pytest.approx(aup([8.0, 8.0], [22.0, 24.0], 24.0))  # 96 tokens / 12 calls each
    assert a.aup_equivalent[0] == pytest.approx(aup([96 / 12, 96 / 7.5], [22.0, 24.0], 24.0))
    md = compare.aup_markdown({"groups": [{"task": "arithmetic", "model": "diffusiongemma", "methods": methods}]})
    assert f"| arithmetic | diffusiongemma | ASRD | ASRD / ASRD + TADM K={K} | 24.0 |" in md
    for m in methods.values():  # results written before families were recorded: no AUP, no error
        del m["family"]
    assert compare.aup_markdown({"groups": [{"task": "arithmetic", "model": "diffusiongemma", "methods": methods}]}) == ""
