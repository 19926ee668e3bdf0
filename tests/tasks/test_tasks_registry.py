"""The benchmarks of tadm.tasks.suite: every task the paper profile scores is built by name."""

import pytest

from tadm import config
from tadm.config.loader import render_profile
from tadm.errors import ConfigError
from tadm.tasks import suite


def test_the_suite_builds_every_task_of_the_paper_profile():
    paper = config.from_dict(render_profile("paper"))
    assert set(paper.posttrain.tasks) - {"arithmetic"} == set(suite.BUILDERS)


def test_unknown_benchmark_is_one_line_naming_the_known():
    with pytest.raises(ConfigError, match="posttrain.tasks: unknown task 'mmlu'; known: arithmetic, gsm8k"):
        suite.build_task("mmlu")
