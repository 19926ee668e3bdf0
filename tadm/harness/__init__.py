"""lm-evaluation-harness for TADM: Table 1's rows and the ASRD comparison's LLaDA rows as the
harness model ``tadm``, Table 1's arithmetic task as a harness task (docs/harness.md).

    python -m tadm.harness --model tadm --model_args row=tadm,K=2 --tasks tadm_arithmetic --limit 16

``python -m tadm.harness`` is the harness's own command line (``lm_eval``: the same flags) with
the ``tadm`` model registered (`tadm.harness.model`) and this package's tasks on the task path
(``tasks/``: ``tadm_arithmetic``) unless ``--include_path`` names another directory. lm-eval
0.4.13 finds third-party models only where they are imported, hence the launcher;
``lm_eval.simple_evaluate(model="tadm", ...)`` works after ``import tadm.harness.model``.

Refused, in one line and before anything loads: ``--confirm_run_unsafe_code`` (the harness's code
tasks execute generated code on the host; this project runs generated code only inside
`tadm.tasks.sandbox`, as Table 1 does for HumanEval and LiveCodeBench), ``--apply_chat_template``
(the tadm model applies each row's own turn), ``--limit`` below 1, ``--num_fewshot`` below 0, an
``--output_path`` that would write over what is there or cannot be written, a ``--model_args``
key given twice, and any flag abbreviated (``--confirm`` is not ``--confirm_run_unsafe_code``:
prefix matching is off). Every error, the harness's own included, is one line (set
``TADM_TRACEBACK=1`` for the traceback).

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
    check_model_args(argv)
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


def check_output_writable(value: str | None) -> None:
    """``--output_path``: where the results go must be writable now, not found unwritable after the
    whole evaluation (its nearest existing folder, or the file's folder, writable by this user)."""
    import os

    from tadm.errors import ConfigError

    if not value:
        return
    path = Path(value).expanduser()
    folder = path.parent if value.endswith(".json") else path
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or str(folder.resolve()).startswith("/proc"):
        raise ConfigError("--output_path", f"{value!r} cannot be written ({str(folder)!r} is not a writable folder); "
                          "refused before the evaluation", "tadm.harness")


def check_args(args) -> None:
    """lm-eval's parsed arguments, refused in one line where this launcher does not run them."""
    from tadm.errors import ConfigError

    def refuse(flag: str, why: str) -> None:
        raise ConfigError(flag, why, "tadm.harness")

    if getattr(args, "confirm_run_unsafe_code", False):
        refuse("--confirm_run_unsafe_code", "refused: the harness would run generated code on the host unsandboxed")
    if getattr(args, "apply_chat_template", False) and getattr(args, "model", None) == "tadm":
        refuse("--apply_chat_template", "refused: the tadm model applies each row's own chat turn to the prompt")
    limit = getattr(args, "limit", None)
    if limit is not None and limit <= 0:
        refuse("--limit", f"must be > 0 (a count of documents, or a fraction of them), got {limit:g}")
    shots = getattr(args, "num_fewshot", None)
    if shots is not None and shots < 0:
        refuse("--num_fewshot", f"must be >= 0, got {shots}")
    check_output_writable(getattr(args, "output_path", None))


def check_model_args(argv: list[str]) -> None:
    """Every ``--model_args`` string of `argv`: a key given twice (``K=2,K=3``: the harness would
    keep one silently) is refused in one line."""
    from tadm.errors import ConfigError

    for i, a in enumerate(argv):
        value = argv[i + 1] if a == "--model_args" and i + 1 < len(argv) else (
            a.split("=", 1)[1] if a.startswith("--model_args=") else None)
        if value is None or value.lstrip().startswith("{"):
            continue
        keys = [item.split("=", 1)[0].strip() for item in value.split(",") if item.strip()]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ConfigError("--model_args", f"{', '.join(twice)} given twice ({value!r}): give each once",
                              "tadm.harness")


def _strict(parser) -> None:
    """No prefix matching and one-line errors for `parser` and its subcommands."""
    import argparse

    def error(message: str, prog: str = parser.prog):
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    parser.allow_abbrev = False
    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)


def main(argv: list[str] | None = None) -> int:
    """``python -m tadm.harness ARGS``: lm-eval's command line with the tadm model and tasks;
    every argument checked before anything loads (module docstring)."""
    import os

    from tadm.errors import TadmError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = harness_argv(argv)
        import tadm.harness.model  # noqa: F401  (registers the model "tadm")
        from lm_eval._cli.harness import HarnessCLI
        from lm_eval.utils import setup_logging

        sys.argv = [PROG, *args]
        setup_logging()
        cli = HarnessCLI()
        _strict(cli._parser)
        parsed = cli.parse_args()
        check_args(parsed)
        cli.execute(parsed)
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 -- the harness's own errors: one line, unless asked for the traceback
        if os.environ.get("TADM_TRACEBACK"):
            raise
        print(f"error: tadm.harness: {type(e).__name__}: {' '.join(str(e).split())[:400]} "
              "(TADM_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1
    return 0


__all__ = ["TASKS_DIR", "check_args", "check_output_path_arg", "check_output_writable", "harness_argv", "main",
           "output_path_arg"]
