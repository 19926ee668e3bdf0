"""lm-evaluation-harness for TADM: Table 1's rows and the ASRD comparison's LLaDA rows as the
harness model ``tadm``, Table 2's pretraining models as the harness model ``tadm_pretrain``,
Table 1's arithmetic task and two Tiny Shakespeare tasks as harness tasks (docs/harness.md).

    python -m tadm.harness --model tadm --model_args row=tadm,K=2 --tasks tadm_arithmetic --limit 16
    python -m tadm.harness --model tadm_pretrain --model_args row=mdlm --tasks tadm_shakespeare

``python -m tadm.harness`` is the harness's own command line (``lm_eval``: the same flags) with
lm-eval's own models (``hf``, ``dummy``, ...) and the ``tadm`` and ``tadm_pretrain`` models
registered (`tadm.harness.model`, `tadm.harness.pretrain`) and this package's tasks on the task
path (``tasks/``) unless ``--include_path`` names another directory. lm-eval 0.4.13 finds
third-party models only where they are imported, hence the launcher;
``lm_eval.simple_evaluate(model="tadm", ...)`` works after ``import tadm.harness.model``
(``tadm_pretrain``: ``import tadm.harness.pretrain``).

For the ``tadm`` and ``tadm_pretrain`` models the launcher also: forwards an explicit ``--seed``
(its torch slot) to the model as its ``seed`` (a different ``seed=`` in ``--model_args`` as well
is refused); refuses ``--gen_kwargs`` keys the model's sampler does not take (``temperature``,
``top_k``, ``do_sample``; for ``tadm`` also ``top_p``); and adds ``pretrained=<the model
directory>`` to the model arguments when neither ``pretrained`` nor its alias ``model_path`` is
given, so the results folder under ``--output_path`` is named after the model
(``models__dg_tadm``). For every model, before the model loads, the tasks are loaded once: a task
whose dataset cannot be loaded (a hub dataset with ``HF_DATASETS_OFFLINE=1``) is one line naming
the task, and ``--num_fewshot`` > 0 (or a task's own ``num_fewshot``) is refused for a task that
would draw its examples from the documents it scores (no training, validation or
``fewshot_split`` split).

Refused, in one line and before anything loads: ``--confirm_run_unsafe_code`` (the harness's code
tasks execute generated code on the host; this project runs generated code only inside
`tadm.tasks.sandbox`, as Table 1 does for HumanEval and LiveCodeBench), ``--apply_chat_template``
for the ``tadm`` model (it applies each row's own turn) and the ``tadm_pretrain`` model (no chat
template), ``--limit`` below 1, ``--num_fewshot`` below 0, an
``--output_path`` that would write over what is there or cannot be written, a ``--model_args``
key given twice, and any flag abbreviated (``--confirm`` is not ``--confirm_run_unsafe_code``:
prefix matching is off). Every error, the harness's own included, is one line (set
``TADM_TRACEBACK=1`` for the traceback).

Nothing here is imported by ``import tadm``; lm-eval is pinned in requirements/lock.txt.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

from tadm.errors import ConfigError, TadmError
from tadm.io import check_output_path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
PROG = "python -m tadm.harness"
OUR_MODELS = ("tadm", "tadm_pretrain")  # the models this package registers
# --gen_kwargs keys a model's sampler does not take (refused in one line before the model loads)
REFUSED_GEN_KWARGS = {"tadm": ("temperature", "top_k", "top_p", "do_sample"),
                      "tadm_pretrain": ("temperature", "top_k", "do_sample")}


def harness_argv(argv: list[str]) -> list[str]:
    """The harness's arguments for `argv`: this package's tasks on the task path unless
    ``--include_path`` is given. Refuses ``--confirm_run_unsafe_code`` (module docstring)."""
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
    value = output_path_arg(argv)
    if value:
        check_output_path(value, "file" if value.endswith(".json") else "dir", "--output_path", "tadm.harness")


def check_output_writable(value: str | None) -> None:
    """``--output_path``: where the results go must be writable now, not found unwritable after the
    whole evaluation (its nearest existing folder, or the file's folder, writable by this user)."""
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
    def refuse(flag: str, why: str) -> None:
        raise ConfigError(flag, why, "tadm.harness")

    if getattr(args, "confirm_run_unsafe_code", False):
        refuse("--confirm_run_unsafe_code", "refused: the harness would run generated code on the host unsandboxed")
    if getattr(args, "apply_chat_template", False) and getattr(args, "model", None) == "tadm":
        refuse("--apply_chat_template", "refused: the tadm model applies each row's own chat turn to the prompt")
    if getattr(args, "apply_chat_template", False) and getattr(args, "model", None) == "tadm_pretrain":
        refuse("--apply_chat_template", "refused: the tadm_pretrain models are not chat models (no chat template)")
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


def seed_given(argv: list[str]) -> bool:
    """Whether `argv` gives the harness's ``--seed`` explicitly."""
    return any(a == "--seed" or a.startswith("--seed=") for a in argv)


def prepare_run(args, explicit_seed: bool) -> None:
    """The model arguments of a ``run`` of the ``tadm`` / ``tadm_pretrain`` model (module
    docstring): --gen_kwargs keys the sampler does not take refused, an explicit --seed forwarded
    as the model's seed, and ``pretrained`` added (the model directory) when absent. Other models
    are left as lm-eval runs them."""
    model = getattr(args, "model", None)
    if model not in OUR_MODELS:
        return
    gen = getattr(args, "gen_kwargs", None) or {}
    refused = [k for k in REFUSED_GEN_KWARGS[model] if k in gen]
    if refused:
        why = ("the tadm model samples with DiffusionGemma's own schedule (posttrain.sample_steps, entropy-bound "
               "acceptance, its temperature schedule)" if model == "tadm" else
               "the tadm_pretrain model samples with its row's sampler at temperature 1 (top_p sets the nucleus p)")
        raise ConfigError("--gen_kwargs", f"{', '.join(refused)} refused: {why}", "tadm.harness")
    model_args = dict(getattr(args, "model_args", None) or {})
    seeds = getattr(args, "seed", None)
    if explicit_seed and seeds and seeds[2] is not None:
        if "seed" in model_args and str(model_args["seed"]).strip() != str(seeds[2]):
            raise ConfigError("--seed", f"the torch seed {seeds[2]} and --model_args seed={model_args['seed']} "
                              "differ: give one", "tadm.harness")
        model_args["seed"] = seeds[2]
    if "pretrained" in model_args and "model_path" in model_args:
        raise ConfigError("--model_args", "pretrained and model_path name the same thing (model_path is its alias): "
                          "give one", "tadm.harness")
    if "pretrained" not in model_args and "model_path" not in model_args:
        if model == "tadm":
            # lazy: imports torch and lm-eval (~2 s) and this package (a circle); arguments are checked first
            from tadm.harness.model import default_model_dir
        else:
            # lazy: imports torch and lm-eval (~2 s) and this package (a circle); arguments are checked first
            from tadm.harness.pretrain import default_model_dir
        directory = default_model_dir(model_args)
        if directory:
            model_args["pretrained"] = directory
    args.model_args = model_args


def fewshot_source(task) -> str | None:
    """The split `task` (an lm-eval task) draws few-shot examples from: its ``fewshot_split``,
    else its training, else its validation split, else its test split (lm-eval's rule); None
    when the task lists its examples itself (``fewshot_config.samples``)."""
    cfg = getattr(task, "config", None)
    fewshot = getattr(task, "fewshot_cfg", None)
    if fewshot is not None and getattr(fewshot, "split", None) is not None:
        return fewshot.split
    if fewshot is not None and getattr(cfg, "fewshot_config", None) is not None and \
            getattr(fewshot, "samples", None) is not None:
        return None
    for split in ("training_split", "validation_split", "test_split"):
        if getattr(cfg, split, None) is not None:
            return getattr(cfg, split)
    return None


def preflight_tasks(args) -> None:
    """Load the tasks of a ``run`` once, before the model: a task that cannot be loaded (its
    dataset not available, e.g. a hub dataset offline) is one line naming it, and few-shot
    examples that would come from the scored documents are refused (module docstring)."""
    # lazy: optional dependency (lm-eval, the harness extra), loaded after the arguments are checked
    from lm_eval.config.evaluate_config import EvaluatorConfig

    if not getattr(args, "tasks", None):
        return
    cfg = EvaluatorConfig.from_cli(copy.copy(args))
    manager = cfg.process_tasks(cfg.metadata)
    offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
               if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")]
    for name in cfg.tasks:
        try:
            loaded = manager.load([name])
        except Exception as e:  # noqa: BLE001 -- the dataset's own error, folded into one line
            where = f" ({offline[0]}=1: hub datasets are not available offline)" if offline else ""
            raise ConfigError("--tasks", f"task {name}: its dataset cannot be loaded{where}: {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:300]}", "tadm.harness") from None
        for task_name, task in (loaded.get("tasks") or {}).items():
            shots = cfg.num_fewshot if cfg.num_fewshot is not None else getattr(task.config, "num_fewshot", None)
            if not shots:
                continue
            source, test = fewshot_source(task), getattr(task.config, "test_split", None)
            if source is not None and source == test:
                raise ConfigError("--num_fewshot", f"{shots} refused for task {task_name}: its few-shot examples "
                                  f"would come from the split it scores ({test!r}); the task needs a fewshot_split, "
                                  "training or validation split", "tadm.harness")


def _strict(parser) -> None:
    """No prefix matching and one-line errors for `parser` and its subcommands."""
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
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = harness_argv(argv)
        import lm_eval.models  # noqa: F401  # lazy: optional dependency (lm-eval), after the arguments are checked; its models register before ours
        import tadm.harness.model  # noqa: F401  # lazy: registers the model "tadm"; imports torch and this package (a circle)
        import tadm.harness.pretrain  # noqa: F401  # lazy: registers "tadm_pretrain"; imports torch and this package (a circle)
        # lazy: optional dependency (lm-eval, the harness extra), loaded after the arguments are checked
        from lm_eval._cli.harness import HarnessCLI
        # lazy: optional dependency (lm-eval, the harness extra), loaded after the arguments are checked
        from lm_eval.utils import setup_logging

        sys.argv = [PROG, *args]
        setup_logging()
        cli = HarnessCLI()
        _strict(cli._parser)
        parsed = cli.parse_args()
        check_args(parsed)
        if getattr(parsed, "command", None) == "run":
            prepare_run(parsed, seed_given(args))
            preflight_tasks(parsed)
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


__all__ = ["OUR_MODELS", "TASKS_DIR", "check_args", "check_output_path_arg", "check_output_writable", "fewshot_source",
           "harness_argv", "main", "output_path_arg", "preflight_tasks", "prepare_run", "seed_given"]
