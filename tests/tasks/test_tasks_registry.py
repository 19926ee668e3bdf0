"""The benchmark registry of tadm.tasks."""

import pytest

from tadm import tasks


@pytest.mark.parametrize("name", list(tasks.BENCHMARKS))
def test_every_benchmark_module_imports_and_scores(name):
    module = tasks.benchmark_module(name)
    assert callable(module.score)


def test_unknown_benchmark():
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'; known: gsm8k"):
        tasks.benchmark_module("mmlu")
