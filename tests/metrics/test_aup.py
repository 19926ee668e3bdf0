"""AUP (tadm.metrics.aup) against the d3LLM leaderboard's published scores."""

import math

import pytest

from tadm.metrics import aup as A

# The LLaDA leaderboard's points, (TPF, accuracy %) per method and task, as the release lists them in
# hao-ai-lab/d3LLM @e5bfcac, AUP_leaderboard/data_llada.yaml (the autoregressive row included: it sets
# y_max), and the AUP each got on the published board, hao-ai-lab/hao-ai-lab.github.io @daad115,
# static/blogs/text-diffusion/dLLM_Results.csv (the "LLaDA:" section, column AUP).
LLADA_BOARD = {
    "GSM8K-CoT": {
        "Qwen-2.5-7B-it": ([(1.0, 74.1)], 74.1000),
        "LLaDA": ([(1.0, 72.55)], 72.5500),
        "Fast-dLLM-LLaDA": ([(1.0, 74.79), (2.77, 74.68)], 205.7811),
        "D2F": ([(1.0, 74.98), (2.88, 74.39)], 213.7564),
        "dParallel-LLaDA": ([(1.0, 74.0), (5.14, 72.63)], 358.1422),
        "d3LLM-LLaDA": ([(1.0, 74.02), (9.11, 73.09)], 637.6549),
    },
    "MATH": {
        "Qwen-2.5-7B-it": ([(1.0, 41.15)], 41.1500),
        "LLaDA": ([(1.0, 32.2)], 32.2000),
        "Fast-dLLM-LLaDA": ([(1.0, 32.1), (1.97, 30.82)], 47.1873),
        "D2F": ([(1.0, 29.1), (2.66, 28.94)], 48.9958),
        "dParallel-LLaDA": ([(1.0, 32.0), (3.17, 30.18)], 64.5356),
        "d3LLM-LLaDA": ([(1.0, 32.76), (5.74, 30.36)], 107.6419),
    },
    "MBPP": {
        "Qwen-2.5-7B-it": ([(1.0, 63.6)], 63.6000),
        "LLaDA": ([(1.0, 41.72)], 41.7200),
        "Fast-dLLM-LLaDA": ([(1.0, 41.58), (2.13, 38.6)], 56.6011),
        "D2F": ([(1.0, 39.10), (2.13, 39.00)], 52.9606),
        "dParallel-LLaDA": ([(1.0, 41.62), (2.35, 40.0)], 60.4513),
        "d3LLM-LLaDA": ([(1.0, 42.0), (4.21, 40.60)], 88.3560),
    },
    "HumanEval": {
        "Qwen-2.5-7B-it": ([(1.0, 67.73)], 67.7300),
        "LLaDA": ([(1.0, 38.28)], 38.2800),
        "Fast-dLLM-LLaDA": ([(1.0, 38.16), (2.56, 37.8)], 54.0245),
        "D2F": ([(1.0, 41.02), (2.69, 40.64)], 61.9823),
        "dParallel-LLaDA": ([(1.0, 39.68), (4.93, 39.02)], 83.6855),
        "d3LLM-LLaDA": ([(1.0, 39.8), (5.95, 39.63)], 96.6405),
    },
    "Long-GSM8K": {
        "Qwen-2.5-7B-it": ([(1.0, 82.56)], 82.5600),
        "LLaDA": ([(1.0, 78.58)], 78.5800),
        "Fast-dLLM-LLaDA": ([(1.0, 78.45), (2.45, 78.01)], 175.3744),
        "D2F": ([(1.0, 76.00), (2.7, 75.66)], 176.9480),
        "dParallel-LLaDA": ([(1.0, 79.15), (4.49, 76.65)], 309.0756),
        "d3LLM-LLaDA": ([(1.0, 78.32), (6.95, 74.22)], 441.1296),
    },
}


@pytest.mark.parametrize("task", list(LLADA_BOARD))
def test_aup_recomputes_published_leaderboard_entries(task):
    """Every LLaDA-board entry of the published leaderboard (dLLM_Results.csv), recomputed from the
    release's points (data_llada.yaml), with y_max the task's best accuracy over all methods."""
    board = LLADA_BOARD[task]
    got = A.aup_by_family({m: pts for m, (pts, _) in board.items()})
    for method, (_, published) in board.items():
        assert got[method] == pytest.approx(published, abs=5e-5), method


def test_a_hand_computed_entry():
    """Fast-dLLM-LLaDA on GSM8K-CoT, y_max = 74.98 (D2F at TPF 1): 1.0 * 74.79 plus the trapezoid."""
    w = [math.exp(-3 * (1 - y / 74.98)) for y in (74.79, 74.68)]
    expected = 74.79 + 0.5 * (2.77 - 1.0) * (74.68 * w[1] + 74.79 * w[0])
    assert A.aup([1.0, 2.77], [74.79, 74.68], 74.98) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(205.7811, abs=5e-5)


def test_single_setting_is_rho_times_y():
    assert A.aup([3.5], [40.0], 80.0) == pytest.approx(140.0)


def test_the_weight_is_capped_at_one():
    assert A.weight(90.0, 80.0) == 1.0 and A.weight(80.0, 80.0) == 1.0
    assert A.weight(40.0, 80.0) == pytest.approx(math.exp(-1.5))


def test_points_are_sorted_by_rho_and_the_first_term_is_unweighted():
    shuffled = A.aup([4.0, 1.0, 2.0], [60.0, 70.0, 66.0], 80.0, offset=10.0)
    assert shuffled == pytest.approx(A.aup([1.0, 2.0, 4.0], [70.0, 66.0, 60.0], 80.0, offset=10.0))
    w = lambda y: A.weight(y, 80.0)  # noqa: E731
    assert A.aup([2.0, 3.0], [70.0, 70.0], 80.0) == pytest.approx(2 * 70 + 0.5 * (70 * w(70) + 70 * w(70)))


def test_points_below_y1_minus_offset_are_dropped():
    """A middle point more than `offset` below y_1 is dropped; the last one is within it."""
    dropped = A.aup([1.0, 2.0, 3.0], [70.0, 60.0, 68.0], 80.0)
    assert dropped == pytest.approx(A.aup([1.0, 3.0], [70.0, 68.0], 80.0))
    assert dropped != pytest.approx(A.aup([1.0, 2.0, 3.0], [70.0, 60.0, 68.0], 80.0, offset=20.0))


def test_degradation_beyond_offset_is_not_scored():
    """The release asserts that the point at the largest rho is within `offset` of y_1."""
    assert A.aup([1.0, 4.0], [70.0, 64.0], 80.0) is None
    assert "more than 5 below" in A.unscored_reason([1.0, 4.0], [70.0, 64.0])
    assert A.unscored_reason([1.0, 4.0], [70.0, 65.0]) is None and A.aup([1.0, 4.0], [70.0, 65.0], 80.0) is not None
    assert A.aup_by_family({"a": [(1.0, 70.0), (4.0, 60.0)], "b": [(1.0, 72.0)]}) == {"a": None, "b": 72.0}


def test_equivalent_forward_extension():
    """TPF counts model calls; the equivalent rho counts weighted layer calls / L. A decode whose
    calls all run every layer has the two equal; a cache running half the layers on average doubles it."""
    assert A.tokens_per_forward(256, 256) == 1.0 and A.tokens_per_forward(256, 64) == 4.0
    assert A.equivalent_rho(256, 256 * 32, 32) == pytest.approx(1.0)
    assert A.equivalent_rho(256, 256 * 16, 32) == pytest.approx(2.0)


@pytest.mark.parametrize("call, expected", [
    (lambda: A.aup([1.0, 2.0], [70.0], 80.0), "rho: 2 values against 1 accuracies in y"),
    (lambda: A.aup([], [], 80.0), "rho: no points"),
    (lambda: A.aup([0.0], [70.0], 80.0), "rho[0]: must be a finite number > 0"),
    (lambda: A.aup([1.0], [0.7e3], 80.0), "y[0]: must be an accuracy in percent"),
    (lambda: A.aup([1.0], [70.0], 0.0), "y_max: must be a finite accuracy > 0"),
    (lambda: A.aup([1.0], [70.0], 80.0, offset=-1.0), "offset: must be >= 0"),
    (lambda: A.aup_by_family({"x": []}), "families['x']: no points"),
    (lambda: A.tokens_per_forward(8, 0), "calls: must be > 0"),
    (lambda: A.equivalent_rho(8, 64.0, 0), "n_layers: must be an integer >= 1"),
], ids=["lengths", "empty", "rho", "y", "y_max", "offset", "family", "calls", "layers"])
def test_bad_input_is_one_line_naming_the_parameter(call, expected):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
