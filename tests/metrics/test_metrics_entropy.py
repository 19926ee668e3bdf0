"""Per-sample token entropy against closed forms."""

import math

import numpy as np
import pytest
import torch

from tadm.metrics.entropy import mean_entropy, sample_entropy


def test_closed_forms():
    uniform = torch.arange(8).repeat(4)  # 8 distinct tokens, 4 times each
    constant = torch.full((32,), 7)
    two_to_one = torch.tensor([1, 1, 2] * 10 + [1, 1])  # 22 ones, 10 twos
    x = torch.stack([uniform, constant, two_to_one])
    h = sample_entropy(x)
    p = 22 / 32
    np.testing.assert_allclose(h, [math.log(8), 0.0, -(p * math.log(p) + (1 - p) * math.log(1 - p))], atol=1e-12)
    assert mean_entropy(x) == pytest.approx(h.mean())


def test_order_does_not_matter_and_inputs_can_be_ragged():
    a = [3, 1, 4, 1, 5, 9, 2, 6]
    assert sample_entropy([a, a[::-1]])[0] == sample_entropy([a[::-1]])[0]
    ragged = sample_entropy([[0, 1], [5, 5, 5], np.array([1, 2, 3, 4])])
    np.testing.assert_allclose(ragged, [math.log(2), 0.0, math.log(4)])
    assert mean_entropy(np.array([[1, 2], [3, 4]])) == pytest.approx(math.log(2))


def test_ignore_ids():
    x = torch.tensor([[1, 2, 0, 0, 0, 0]])
    assert sample_entropy(x)[0] > math.log(2) - 1  # padding counts by default
    assert sample_entropy(x, ignore_ids=[0])[0] == pytest.approx(math.log(2))


@pytest.mark.parametrize("bad,words", [
    ([], "empty"),
    (torch.zeros(3), "2-D"),
    ([[1, 2], [[1]]], "1-D"),
    (torch.rand(2, 3), "integer"),
    ("abc", "samples"),
])
def test_bad_inputs_name_the_argument(bad, words):
    with pytest.raises(ValueError, match=words):
        sample_entropy(bad)


def test_a_sample_left_empty_is_named():
    with pytest.raises(ValueError, match=r"samples\[1\]"):
        sample_entropy([[1, 2], [0, 0]], ignore_ids=[0])
