"""LiveCodeBench code generation: contest problems scored by running the program on tests.

Rows have the hub's fields (``livecodebench/code_generation_lite``): ``question_content``,
``starter_code``, ``public_test_cases`` and ``private_test_cases`` -- each a list (or its JSON
text) of {"input", "output", "testtype"} -- and optionally ``metadata`` (JSON with
``func_name``). The hub stores private tests compressed (base64 of zlib of a pickled JSON
string); they are decoded with an unpickler that refuses every object but plain data.

Two kinds of tests, graded as LiveCodeBench's own grader (``lcb_runner.evaluation.testing_util``)
grades them:

* ``stdin`` (AtCoder/Codeforces style): the program reads the input on stdin; its output and the
  expected one, each stripped and cut into stripped lines, must have as many lines, and each line
  must be equal or, token by token, equal as decimal numbers (``0.50`` is ``0.5``; `same_output`).
  The program ends normally also through ``SystemExit`` (``sys.exit(0)`` after printing the
  answer, as the official grader catches it); ``os._exit`` and signals still end it early.
* ``functional`` (LeetCode style): ``Solution().<method>(*args)``, the arguments being the
  input's newline-separated JSON values; the result (a tuple read as a list) must equal the
  expected JSON value.

Both run after the official grader's import header (`IMPORT_HEADER`: the star imports of string,
re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, functools,
operator, io, sys, json, builtins and typing, the plain imports, and a recursion limit of 50,000),
so a program using ``sqrt`` without importing it runs as it does there. Threads run (the sandbox
allows them, processes never). A test passes only when the program ran to its end (the sandbox's
completion marker) and its output is right. A problem is solved when every test passes; scoring
stops at the first failure. Remaining differences from the official grader: docs/deviations.md.
"""

from __future__ import annotations

import base64
import decimal
import io
import json
import pickle
import re
import zlib
from pathlib import Path

from tadm.errors import DataError
from tadm.io import json_loads
from tadm.tasks.common import load_hub, read_jsonl
from tadm.tasks.sandbox import run_python

HUB_NAME = "livecodebench/code_generation_lite"
TIMEOUT_S = 6.0  # per test

# The paper's LiveCodeBench-v6, pinned: the hub repository's files of release_v6 (the release
# tags are cumulative: release_vN = test.jsonl, test2.jsonl, ..., testN.jsonl; release_v6 is
# 1,055 problems) read by the packaged JSON builder (datasets >= 4 runs no loading scripts, so
# version_tag= is not available), and the release's contest-date window, May 2023 to April 2025
# (LiveCodeBench's release notes). Problems dated outside the window are dropped, so a newer
# file on the hub cannot leak in.
RELEASE = "release_v6"
RELEASE_FILES = {"release_v6": ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl")}
DATE_WINDOW = {"release_v6": ("2023-05-01", "2025-04-30")}  # inclusive, by contest_date

# The official grader's import header: the modules generated code takes for granted (sqrt,
# defaultdict, List, heapq ...), star-imported and imported, and a deep recursion limit.
HEADER_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                  "statistics", "itertools", "functools", "operator", "io", "sys", "json")
IMPORT_HEADER = ("".join(f"from {m} import *\n" for m in (*HEADER_MODULES, "builtins", "typing"))
                 + "".join(f"import {m}\n" for m in HEADER_MODULES) + "sys.setrecursionlimit(50000)\n")

__all__ = ["load_livecodebench", "tests", "prompt", "extract_code", "score", "same_output", "IMPORT_HEADER"]


# --- loading -------------------------------------------------------------------------------


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles strings, numbers, lists and dicts only: any class or function is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _decode_tests(value, where: str) -> list[dict]:
    """A test list from a list, its JSON text, or the hub's compressed private-test encoding."""
    if isinstance(value, list):
        cases = value
    elif isinstance(value, str):
        try:
            if not value.strip() or value.lstrip().startswith("["):
                cases = json_loads(value) if value.strip() else []
            else:
                packed = zlib.decompress(base64.b64decode(value))
                cases = json_loads(_PlainDataUnpickler(io.BytesIO(packed)).load())
        except (ValueError, TypeError, zlib.error, pickle.UnpicklingError, EOFError) as e:
            raise DataError(f"{where}: test cases are neither JSON nor the hub's compressed form ({e})") from None
        if not isinstance(cases, list):
            raise DataError(f"{where}: test cases must decode to a list, got {type(cases).__name__}")
    else:
        raise DataError(f"{where}: test cases must be a list or a string, got {type(value).__name__}")
    for case in cases:
        if not (isinstance(case, dict) and isinstance(case.get("input"), str) and isinstance(case.get("output"), str)
                and case.get("testtype") in ("stdin", "functional")):
            raise DataError(f"{where}: each test needs string 'input' and 'output' and testtype 'stdin' or 'functional'")
    return cases


def tests(row: dict, *, private: bool = True) -> list[dict]:
    """The row's test cases: public ones, then (if `private`) private ones."""
    where = f"LiveCodeBench {row.get('question_id', '?')}"
    cases = _decode_tests(row.get("public_test_cases") or [], where + " public_test_cases")
    if private:
        cases = cases + _decode_tests(row.get("private_test_cases") or [], where + " private_test_cases")
    return cases


def hub_files(release: str = RELEASE) -> list[str]:
    """Local paths of `release`'s files of ``HUB_NAME``, fetched through the hub cache
    (``hf_hub_download``: downloaded once, then read from the cache, also with HF_HUB_OFFLINE=1;
    ``hf://`` paths would ask the hub for the revision on every load and fail offline)."""
    from huggingface_hub import hf_hub_download  # lazy: hf_hub_download takes ~0.3 s to import; only fetching the release needs it

    try:
        return [hf_hub_download(HUB_NAME, name, repo_type="dataset") for name in RELEASE_FILES[release]]
    except Exception as e:  # offline without a cache, unknown file, ...: one line, never a traceback
        raise DataError(f"cannot fetch {HUB_NAME} {release} from the hub: {type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}") from None


def in_window(rows: list[dict], start: str, end: str, where: str = "LiveCodeBench") -> list[dict]:
    """The rows whose ``contest_date`` (ISO date or date-time, first 10 characters compared)
    lies in [start, end]; rows without a contest_date are kept (a local file may omit it)."""
    kept = []
    for i, row in enumerate(rows):
        date = row.get("contest_date")
        if date is None or date == "":
            kept.append(row)
            continue
        day = str(date)[:10]
        if len(day) != 10 or day[4] != "-" or day[7] != "-":
            raise DataError(f"{where}: row {i + 1}: contest_date {date!r} is not an ISO date (YYYY-MM-DD...)")
        if start <= day <= end:
            kept.append(row)
    return kept


def load_livecodebench(source: str, release: str = RELEASE) -> list[dict]:
    """Problems from `source`: "hub" (`release`'s files of ``HUB_NAME``) or a local jsonl file,
    restricted to `release`'s contest-date window (``DATE_WINDOW``).

    Rows keep the hub's fields; each is checked to have a question and at least one test.
    """
    if release not in RELEASE_FILES:
        raise DataError(f"LiveCodeBench release {release!r} is not pinned here; known: {', '.join(RELEASE_FILES)}")
    if source == "hub":
        rows, where = load_hub("json", None, "train", data_files=hub_files(release)), f"{HUB_NAME} {release}"
    else:
        rows, where = read_jsonl(source, ("question_content",)), str(Path(source).expanduser())
    rows = in_window(rows, *DATE_WINDOW[release], where=where)
    if not rows:
        raise DataError(f"{where}: no problem dated inside {release}'s window {DATE_WINDOW[release][0]}..{DATE_WINDOW[release][1]}")
    for i, row in enumerate(rows):
        row.setdefault("question_id", f"lcb-{i}")
        row.setdefault("starter_code", "")
        if not isinstance(row["question_content"], str) or not isinstance(row["starter_code"], str):
            raise DataError(f"{where}: row {i + 1}: 'question_content' and 'starter_code' must be strings")
        if not tests(row):
            raise DataError(f"{where}: row {i + 1}: no test cases")
    return rows


# --- prompt and code -----------------------------------------------------------------------


def prompt(row: dict) -> str:
    """The 0-shot prompt: the problem, how the solution is run, and the code-block format."""
    parts = [
        "Write a Python program that solves the following problem and passes all its tests.\n\n",
        f"Problem:\n{row['question_content'].strip()}\n\n",
    ]
    if row.get("starter_code", "").strip():
        parts.append(
            "Complete the following starter code and give the whole solution in one Python code block:\n"
            f"```python\n{row['starter_code'].rstrip()}\n```\n\n"
        )
    else:
        parts.append(
            "Read the input from standard input and write the answer to standard output. "
            "Give the whole program in one Python code block:\n```python\n# your code here\n```\n\n"
        )
    parts.append("Answer:\n")
    return "".join(parts)


_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.IGNORECASE)


def extract_code(text: str) -> str:
    """The code in the last ```python fenced block of `text` (to the end of the text if that
    block was cut off before its closing fence); the whole text if there is no such block."""
    opening = None
    for opening in _OPEN_FENCE.finditer(text):
        pass
    if opening is None:
        return text
    body = text[opening.end() :]
    end = body.find("```")
    return body if end < 0 else body[:end]


def _method_name(row: dict) -> str:
    metadata = row.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json_loads(metadata) if metadata.strip() else {}
        except json.JSONDecodeError:
            raise DataError(f"LiveCodeBench {row.get('question_id', '?')}: 'metadata' is not valid JSON") from None
    if metadata.get("func_name"):
        return metadata["func_name"]
    match = re.search(r"def\s+(\w+)\s*\(\s*self", row.get("starter_code", ""))
    if not match:
        raise DataError(f"LiveCodeBench {row.get('question_id', '?')}: functional tests but no method name "
                        "in 'metadata' (func_name) or 'starter_code'")
    return match.group(1)


def _functional_program(code: str, method: str) -> str:
    return (
        IMPORT_HEADER + code + "\n\n"
        "import json as _json, sys as _sys\n"
        "_args = [_json.loads(_line) for _line in _sys.stdin.read().split('\\n') if _line.strip()]\n"
        f"_result = Solution().{method}(*_args)\n"
        "print(_json.dumps(list(_result) if isinstance(_result, tuple) else _result))\n"
    )


def _stdin_program(code: str) -> str:
    """The program of a stdin test: the import header, then the code run as the main module
    (its own line numbers in tracebacks), a ``SystemExit`` at any status ending it normally, as
    the official grader's ``except SystemExit`` does."""
    return (
        IMPORT_HEADER
        + f"_code = compile({code!r}, 'solution.py', 'exec', dont_inherit=True)\n"
        "try:\n"
        "    exec(_code, globals())\n"
        "except SystemExit:\n"
        "    pass\n"
    )


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[decimal.Decimal] | None:
    try:
        return [decimal.Decimal(token) for token in line.split()]
    except decimal.InvalidOperation:
        return None


def same_output(got: str, expected: str) -> bool:
    """The official grader's comparison of a stdin test's output: after stripping, the same number
    of lines, each stripped line equal or, split on whitespace, equal token by token as decimal
    numbers (``0.50`` and ``0.5``, ``1e3`` and ``1000``; a token that is not a number fails)."""
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None or dx != dy:
            return False
    return True


def _passes(case: dict, code: str, method: str | None, sandbox_kw: dict) -> bool:
    if case["testtype"] == "stdin":
        result = run_python(_stdin_program(code), stdin=case["input"], **sandbox_kw)
        return result.passed and same_output(result.stdout, case["output"])
    result = run_python(_functional_program(code, method), stdin=case["input"], **sandbox_kw)
    if not result.passed or not result.stdout.strip():
        return False
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]) == json.loads(case["output"])
    except json.JSONDecodeError:
        return False


def score(row: dict, completion: str, *, private: bool = True, **sandbox_kw) -> bool:
    """Whether the code in `completion` passes every test of the row (keyword arguments go to
    run_python; the default timeout is TIMEOUT_S per test)."""
    sandbox_kw.setdefault("timeout_s", TIMEOUT_S)
    code = extract_code(completion)
    cases = tests(row, private=private)
    method = _method_name(row) if any(c["testtype"] == "functional" for c in cases) else None
    return bool(cases) and all(_passes(case, code, method, sandbox_kw) for case in cases)
