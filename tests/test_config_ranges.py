"""Params that cannot be meant are refused by `check` and at load: a list
repeating a value, a refresh interval beyond the steps it divides, a feature-cache share that
recomputes no row, a margin beyond a 0-1 metric. The committed profiles still validate."""

import copy
import subprocess
import sys

import pytest
import yaml

from tadm import config
from tadm.dryrun import run as dryrun
from tadm.errors import ConfigError


def _raw(**changes):
    raw = copy.deepcopy(config.render_profile("default"))
    for dotted, value in changes.items():
        *path, leaf = dotted.split(".")
        node = raw
        for part in path:
            node = node[part]
        node[leaf] = value
    return raw


def _check(tmp_path, raw):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return subprocess.run([sys.executable, "-m", "tadm", "--params", str(path), "check"], capture_output=True,
                          text=True, cwd=config.ROOT, timeout=120)


CASES = [
    ("posttrain.cache_methods", ["naive", "naive"], "posttrain.cache_methods: must not repeat a value, got ['naive', 'naive']"),
    ("claims.margin_mauve", 5, "claims.margin_mauve: must be < 1.0, got 5.0"),
    ("asrd.llada_cache_refresh", [1_000_000_000], "asrd.llada_cache_refresh: must be <= llada_steps (256"),
    ("posttrain.feature_cache_share", 1e-300, "posttrain.feature_cache_share: recomputes no row of the 32-row canvas"),
]


@pytest.mark.parametrize("key,value,words", CASES, ids=[c[0] for c in CASES])
def test_impossible_values_are_refused_by_check_and_at_load(tmp_path, key, value, words):
    """Before (but margin_mauve): `python -m tadm check` said valid and load accepted them."""
    with pytest.raises(ConfigError) as e:
        config.from_dict(_raw(**{key: value}))
    assert words in str(e.value) and "\n" not in str(e.value)
    proc = _check(tmp_path, _raw(**{key: value}))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: params.yaml: ") and words in lines[0], proc.stderr


@pytest.mark.parametrize("key,value,words", [
    # lists that must not repeat a value
    ("train.models", ["mdlm", "mdlm"], "train.models: must not repeat a value"),
    ("train.refresh_choices", [1, 1], "train.refresh_choices: must not repeat a value"),
    ("sample.budgets", [{"T": 64, "K": 8}, {"T": 64, "K": 4}], "sample.budgets[1].T: budget T = 64 is listed twice"),
    ("sample.sweep_refresh", [1, 2, 2], "sample.sweep_refresh: must not repeat a value"),
    ("posttrain.tasks", ["gsm8k", "gsm8k"], "posttrain.tasks: must not repeat a value"),
    ("asrd.seeds", [0, 0], "asrd.seeds: must not repeat a value"),
    ("asrd.llada_cache_methods", ["dual", "dual"], "asrd.llada_cache_methods: must not repeat a value"),
    ("asrd.llada_tasks", ["gsm8k", "gsm8k"], "asrd.llada_tasks: must not repeat a value"),
    ("sft.arithmetic_ops", ["+", "+"], "sft.arithmetic_ops: must not repeat a value"),
    # refresh intervals beyond the steps they divide
    ("posttrain.refresh_every", [2, 49], "posttrain.refresh_every: must be <= sample_steps (48"),
    ("sample.budgets", [{"T": 64, "K": 8}, {"T": 128, "K": 1000}], "sample.budgets[1].K: must be <= its budget's T (128"),
    ("sample.sweep_refresh", [1, 129], "sample.sweep_refresh: must be <= the largest budget's T (128)"),
    ("asrd.refresh_every", 10_000, "asrd.refresh_every: must be <= the decoding steps"),
    # a GPT-2 whose width its heads do not split
    ("eval.trained.n_heads", 5, "eval.trained.d_model: must be a multiple of n_heads (5"),
    # sizes no run can reach, a number written as a quoted string, a comparator Table 1 does not run
    ("sample.budgets", [{"T": 10**9, "K": 4}], "sample.budgets[0].T: must be <= 1048576"),
    ("posttrain.max_new_tokens", 10**12, "posttrain.max_new_tokens: must be <= 1048576"),
    ("posttrain.feature_cache_share", "0.5", "posttrain.feature_cache_share: expected a number, got '0.5'"),
    ("claims.training_free_comparator", ["naive"], "claims.training_free_comparator: each must be one of posttrain.cache_methods"),
    ("claims.training_free_comparator", "feature", "claims.training_free_comparator: expected a list"),
    ("claims.training_free_comparator", [], "claims.training_free_comparator"),
])
def test_reviewed_ranges(key, value, words):
    extra = {"posttrain.cache_methods": ["feature"]} if key == "claims.training_free_comparator" else {}
    with pytest.raises(ConfigError) as e:
        config.from_dict(_raw(**{key: value}, **extra))
    assert words in str(e.value), str(e.value)


def test_yaml_1_1_exponents_still_read_as_numbers():
    """YAML 1.1 leaves 3e-4 a string; it is read as the number it is (a quoted '0.5' is not)."""
    assert config.from_dict(_raw(**{"train.lr": "3e-4"})).train.lr == 3e-4
    assert config.from_dict(_raw(**{"posttrain.cache_methods": []})).posttrain.cache_methods == []


def test_the_limits_themselves_are_allowed():
    """K = sample_steps, K = llada_steps and a share of one canvas row are meant: accepted."""
    p = config.from_dict(_raw(**{"posttrain.refresh_every": [2, 48], "asrd.llada_cache_refresh": [2, 256],
                                 "posttrain.feature_cache_share": 1 / 32, "sample.budgets": [{"T": 64, "K": 64}, {"T": 128, "K": 128}]}))
    assert p.posttrain.refresh_every == [2, 48] and p.posttrain.feature_cache_share == 1 / 32
    assert config.from_dict(_raw(**{"posttrain.feature_cache_share": 0})).posttrain.feature_cache_share == 0.0


@pytest.mark.parametrize("name", config.available_profiles())
def test_every_profile_still_validates(name):
    assert config.from_dict(config.render_profile(name)).profile == name


def test_the_dry_run_params_still_validate():
    assert config.from_dict(dryrun.render()).profile == "paper"


def test_a_row_sampled_with_k_above_its_t_is_refused_before_any_work():
    from tadm.experiments import table2

    with pytest.raises(ConfigError, match=r"^sampling: K: must be <= T \(8; .*got 9$"):
        table2.run_row("tadm", config.from_dict(_raw()), scorer=None, steps=[8, 16], K=9)
