"""LiveCodeBench: two hand-written problems (stdin and functional) scored in the sandbox."""

import base64
import json
import os
import pickle
import time
import zlib

import pytest

from tadm.errors import DataError
from tadm.tasks import livecodebench as lcb


def hub_compressed(cases: list[dict]) -> str:
    """Private tests the way the hub stores them: base64(zlib(pickle(json text)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


STDIN_ROW = {
    "question_id": "abc000_a",
    "question_title": "Sum and difference",
    "question_content": "Given integers A and B, print A+B on the first line and A-B on the second.",
    "starter_code": "",
    "public_test_cases": json.dumps([{"input": "3 5\n", "output": "8\n-2\n", "testtype": "stdin"}]),
    "private_test_cases": hub_compressed([{"input": "10 -4\n", "output": "6\n14", "testtype": "stdin"},
                                         {"input": "0 0", "output": "0\n0\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
FUNCTIONAL_ROW = {
    "question_id": "2000",
    "question_title": "two-sum",
    "question_content": "Return the indices of the two numbers in nums that add up to target.",
    "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
    "public_test_cases": json.dumps([{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
    "private_test_cases": json.dumps([{"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "twoSum"}),
}

STDIN_GOOD = "a, b = map(int, input().split())\nprint(a + b, '  ')\nprint(a - b)\n"  # trailing spaces are fine
STDIN_WRONG = "a, b = map(int, input().split())\nprint(a + b)\nprint(b - a)\n"
FUNCTIONAL_GOOD = (
    "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
    "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
    "                return [seen[target - x], i]\n            seen[x] = i\n"
)
FUNCTIONAL_WRONG = FUNCTIONAL_GOOD.replace("[seen[target - x], i]", "[i, seen[target - x]]")
INFINITE = "while True:\n    pass\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nIt runs in O(n)."


def test_decodes_public_and_hub_compressed_private_tests():
    cases = lcb.tests(STDIN_ROW)
    assert [c["input"] for c in cases] == ["3 5\n", "10 -4\n", "0 0"]
    assert len(lcb.tests(STDIN_ROW, private=False)) == 1


@pytest.mark.parametrize("row, good", [(STDIN_ROW, STDIN_GOOD), (FUNCTIONAL_ROW, FUNCTIONAL_GOOD)])
def test_correct_solution_passes(row, good):
    assert lcb.score(row, fenced(good))


@pytest.mark.parametrize("row, wrong", [(STDIN_ROW, STDIN_WRONG), (FUNCTIONAL_ROW, FUNCTIONAL_WRONG),
                                        (STDIN_ROW, "print(undefined)"), (FUNCTIONAL_ROW, "class Solution:\n    pass\n")])
def test_wrong_solution_fails(row, wrong):
    assert not lcb.score(row, fenced(wrong))


def test_only_private_tests_can_catch_a_solution():
    hardcoded = "print(8)\nprint(-2)\n"  # right on the public test only
    assert lcb.score(STDIN_ROW, hardcoded, private=False)
    assert not lcb.score(STDIN_ROW, hardcoded)


@pytest.mark.parametrize("row", [STDIN_ROW, FUNCTIONAL_ROW])
def test_infinite_loop_fails_by_timeout(row):
    code = INFINITE if row is STDIN_ROW else FUNCTIONAL_GOOD.replace("seen = {}", "while True:\n            pass")
    start = time.monotonic()
    assert not lcb.score(row, fenced(code), timeout_s=1.0)
    assert time.monotonic() - start < 4  # stops at the first failing test


@pytest.mark.parametrize(
    "text, expected",
    [
        ("```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```", "print(2)\n"),  # the last block
        ("```py\nprint(3)\n```", "print(3)\n"),
        ("Sure:\n```Python\nprint(4)\n", "print(4)\n"),  # cut off before the closing fence
        ("print(5)\n", "print(5)\n"),  # no fence: the whole text
        ("```python\nprint(6)\n```\nOutput:\n```\n6\n```", "print(6)\n"),  # a plain block is not code
    ],
)
def test_extract_code(text, expected):
    assert lcb.extract_code(text) == expected


def test_prompts():
    stdin_prompt, functional_prompt = lcb.prompt(STDIN_ROW), lcb.prompt(FUNCTIONAL_ROW)
    assert STDIN_ROW["question_content"] in stdin_prompt and "standard input" in stdin_prompt
    assert "```python\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n```" in functional_prompt
    assert "standard input" not in functional_prompt
    assert stdin_prompt.endswith("Answer:\n") and functional_prompt.endswith("Answer:\n")


def test_load_local_jsonl(tmp_path):
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(STDIN_ROW) + "\n" + json.dumps(FUNCTIONAL_ROW) + "\n")
    rows = lcb.load_livecodebench(str(path))
    assert [r["question_id"] for r in rows] == ["abc000_a", "2000"]
    assert lcb.score(rows[1], FUNCTIONAL_GOOD)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"public_test_cases": "[]", "private_test_cases": ""}, "no test cases"),
        ({"public_test_cases": json.dumps([{"input": "1", "output": "1", "testtype": "file"}])}, "testtype"),
        ({"private_test_cases": "not json nor base64!"}, "neither JSON nor"),
        ({"question_content": None}, "must be strings"),
    ],
)
def test_load_rejects_bad_rows(tmp_path, change, message):
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(STDIN_ROW | change) + "\n")
    with pytest.raises(DataError, match=message):
        lcb.load_livecodebench(str(path))


class _Exploit:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_compressed_tests_never_unpickle_objects(tmp_path):
    """A pickle that would run a command when loaded is refused, and nothing runs."""
    marker = tmp_path / "pwned"
    packed = base64.b64encode(zlib.compress(pickle.dumps(_Exploit(str(marker))))).decode()
    with pytest.raises(DataError, match="refusing to load"):
        lcb.tests(STDIN_ROW | {"private_test_cases": packed})
    assert not marker.exists()


def test_functional_tests_need_a_method_name():
    row = FUNCTIONAL_ROW | {"metadata": "{}", "starter_code": ""}
    with pytest.raises(DataError, match="no method name"):
        lcb.score(row, FUNCTIONAL_GOOD)
    # without metadata the name comes from the starter code
    assert lcb.score(FUNCTIONAL_ROW | {"metadata": ""}, FUNCTIONAL_GOOD, private=False)


# --- the paper's release_v6, pinned ---------------------------------------------------------


def test_release_v6_is_pinned_to_its_files_and_date_window():
    assert lcb.RELEASE == "release_v6" and lcb.DATE_WINDOW["release_v6"] == ("2023-05-01", "2025-04-30")
    assert lcb.RELEASE_FILES["release_v6"] == ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl",
                                               "test6.jsonl")


def test_problems_outside_the_window_are_dropped(tmp_path):
    rows = [{**STDIN_ROW, "question_id": "early", "contest_date": "2023-04-30T00:00:00"},
            {**STDIN_ROW, "question_id": "first", "contest_date": "2023-05-01T00:00:00"},
            {**FUNCTIONAL_ROW, "question_id": "last", "contest_date": "2025-04-30"},
            {**STDIN_ROW, "question_id": "v7", "contest_date": "2025-05-01T12:00:00"},
            {**STDIN_ROW, "question_id": "undated"}]
    path = tmp_path / "lcb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["question_id"] for r in lcb.load_livecodebench(str(path))] == ["first", "last", "undated"]
    assert [r["question_id"] for r in lcb.in_window(rows, "2025-01-01", "2025-12-31")] == ["last", "v7", "undated"]
    with pytest.raises(DataError, match="row 1: contest_date 'May 2024' is not an ISO date"):
        lcb.in_window([{"contest_date": "May 2024"}], *lcb.DATE_WINDOW["release_v6"])
    path.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match="no problem dated inside release_v6's window 2023-05-01..2025-04-30"):
        lcb.load_livecodebench(str(path))


def test_the_hub_release_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="cannot fetch livecodebench/code_generation_lite release_v6") as e:
        lcb.load_livecodebench("hub")
    assert "\n" not in str(e.value)


def test_hub_files_read_the_hub_cache_offline_and_fail_in_one_line_without_it(tmp_path, monkeypatch):
    from pathlib import Path

    from huggingface_hub import constants

    from tadm.dryrun.standins import hub_snapshot
    from tadm.errors import DataError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(DataError, match="cannot fetch livecodebench/code_generation_lite release_v6"):
        lcb.hub_files()
    snapshot = hub_snapshot(tmp_path, lcb.HUB_NAME, "dataset")
    for name in lcb.RELEASE_FILES["release_v6"]:
        (snapshot / name).write_text("{}\n")
    assert [Path(f).name for f in lcb.hub_files()] == list(lcb.RELEASE_FILES["release_v6"])


@pytest.mark.parametrize("row, code", [
    # functional tests: the expected result printed by the code itself, then os._exit before the
    # harness's own call could run (this used to pass: the last stdout line matched)
    (FUNCTIONAL_ROW, "import json, os, sys\n_inp = sys.stdin.read()\n"
                     "print('[0, 1]' if _inp.startswith('[2') else '[1, 2]')\nos._exit(0)\n"),
    (FUNCTIONAL_ROW, FUNCTIONAL_GOOD + "import sys\nsys.exit(0)\n"),
    # a stdin program killed by itself or leaving by os._exit after its output has not ended normally
    (STDIN_ROW, STDIN_GOOD + "import os\nos._exit(0)\n"),
])
def test_a_program_that_exits_before_its_end_fails(row, code):
    """A test passes only when the program ran to its end (the sandbox's completion marker); for
    a stdin program a SystemExit is its end (as in the official grader), os._exit is not."""
    assert not lcb.score(row, fenced(code))


# --- what the official grader (lcb_runner) accepts -------------------------------------------------


@pytest.mark.parametrize("code", [
    STDIN_GOOD + "import sys\nsys.exit(0)\n",  # an exit after the answer: the grader catches SystemExit
    STDIN_GOOD + "raise SystemExit\n",
    STDIN_GOOD + "import sys\nsys.exit(1)\n",  # at any status, as `except SystemExit: pass` does
    # the deep-recursion idiom: the work in a thread with a larger stack
    "import sys, threading\nsys.setrecursionlimit(10 ** 6)\nthreading.stack_size(1 << 26)\n"
    "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n    print(a - b)\n"
    "threading.Thread(target=main).start()\n",
    # names of the official import header used without importing them
    "a, b = map(int, input().split())\nprint(int(sqrt((a + b) ** 2)))\nprint(a - b)\n",
])
def test_programs_the_official_grader_accepts_pass(code):
    assert lcb.score(STDIN_ROW, fenced(code)), code


def test_numbers_are_compared_as_decimals_line_by_line():
    assert lcb.same_output("0.50\n", "0.5") and lcb.same_output("1 2.0  3\n", "1 2 3.00")
    assert lcb.same_output("1e3", "1000") and lcb.same_output(" 8 \n-2\n", "8\n-2")
    assert not lcb.same_output("0.51", "0.5") and not lcb.same_output("8\n-2\n0", "8\n-2")
    assert not lcb.same_output("yes", "Yes") and not lcb.same_output("1 2", "1 2 3")
    assert not lcb.same_output("50000000000000000", "50000000000000001")  # exact, not close
    row = {**STDIN_ROW, "public_test_cases": json.dumps([{"input": "1 2\n", "output": "0.5\n", "testtype": "stdin"}]),
           "private_test_cases": "[]"}
    assert lcb.score(row, fenced("a, b = map(int, input().split())\nprint(f'{a / b:.2f}')\n"))  # 0.50


def test_a_functional_solution_may_use_the_header_and_return_a_tuple():
    code = FUNCTIONAL_GOOD.replace("return [seen[target - x], i]", "return (seen[target - x], floor(i))")
    assert lcb.score(FUNCTIONAL_ROW, fenced(code))
