"""lm-evaluation-harness for TADM: Table 1's rows and the ASRD comparison's LLaDA rows as the
harness model ``tadm``, Table 1's arithmetic task as a harness task (docs/harness.md).

    python -m tadm.harness --model tadm --model_args row=tadm,K=2 --tasks tadm_arithmetic --limit 16

``python -m tadm.harness`` is the harness's own command line (``lm_eval``: the same flags) with
the ``tadm`` model registered (`tadm.harness.model`) and this package's tasks on the task path
(``tasks/``: ``tadm_arithmetic``) unless ``--include_path`` names another directory. lm-eval
0.4.13 finds third-party models only where they are imported, hence the launcher;
``lm_eval.simple_evaluate(model="tadm", ...)`` works after ``import tadm.harness.model``.

Refused, in one line: ``--confirm_run_unsafe_code`` (the harness's code tasks execute generated
code on the host; this project runs generated code only inside `tadm.tasks.sandbox`, as Table 1
does for HumanEval and LiveCodeBench).

Nothing here is imported by ``import tadm``; lm-eval is pinned in requirements/lock.txt.
"""

from __future__ import annotations

import sys
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
PROG = "python -m tadm.harness"


def harness_argv(argv: list[str]) -> list[str]:
    """The harness's arguments for `argv`: this package's tasks on the task path unless
    ``--include_path`` is given. Refuses ``--confirm_run_unsafe_code`` (module docstring)."""
    from tadm.errors import ConfigError

    if any(a == "--confirm_run_unsafe_code" or a.startswith("--confirm_run_unsafe_code=") for a in argv):
        raise ConfigError("--confirm_run_unsafe_code", "refused: the harness would run generated code on the host "
                          "unsandboxed; Table 1 scores HumanEval and LiveCodeBench inside tadm.tasks.sandbox "
                          "(python -m tadm table1)", source="tadm.harness")
    check_output_path_arg(argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
        argv = [*argv, "--include_path", str(TASKS_DIR)]
    return argv


def output_path_arg(argv: list[str]) -> str | None:
    """The value of the harness's ``--output_path`` (``-o``) in `argv`, the last one given; None
    without one."""
    value = None
    for i, a in enumerate(argv):
        if a in ("--output_path", "-o") and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--output_path="):
            value = a.split("=", 1)[1]
        elif a.startswith("-o") and not a.startswith("--") and len(a) > 2:
            value = a[2:].removeprefix("=")
    return value


def check_output_path_arg(argv: list[str]) -> None:
    """``--output_path`` is refused in one line, before the model loads, where the harness would
    write over what is there: lm-eval writes ``<stem>_<date>.json`` beside a path ending in
    ``.json`` (a file path: an existing folder there is refused) and makes folders under any
    other (a folder path: an existing file there is refused)."""
    from tadm.io import check_output_path

    value = output_path_arg(argv)
    if value:
        check_output_path(value, "file" if value.endswith(".json") else "dir", "--output_path", "tadm.harness")


def main(argv: list[str] | None = None) -> int:
    """``python -m tadm.harness ARGS``: lm-eval's command line with the tadm model and tasks."""
    from tadm.errors import TadmError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = harness_argv(argv)
        import tadm.harness.model  # noqa: F401  (registers the model "tadm")
        from lm_eval.__main__ import cli_evaluate

        sys.argv = [PROG, *args]
        cli_evaluate()
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


__all__ = ["TASKS_DIR", "check_output_path_arg", "harness_argv", "main", "output_path_arg"]
