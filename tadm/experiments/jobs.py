"""The program of every process of a multi-process run: ``python -m tadm.experiments.jobs <job> <spec.json>``,
started by :func:`tadm.experiments.worker.launch` under torchrun (its docstring: the spec file,
the jobs' arguments, how a failure ends the group).

Each job is a function ``(params, Dist, args) -> a JSON value`` of the module that also runs it
in one process; this module imports them, the launching modules never import this one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from tadm import config, runtime
from tadm.config import Params
from tadm.errors import TadmError
from tadm.experiments import table1, table2
from tadm.experiments.asrd import compare
from tadm.io import atomic_write_text

Job = Callable[[Params, runtime.Dist, dict], Any]

JOBS: dict[str, Job] = {"row": table2.row_job, "sweep": table2.sweep_job, "table1": table1.worker_job,
                        "table1_speed": table1.speed_job, "asrd": compare.worker_job}


def main(argv: list[str] | None = None) -> int:
    """Run one job of :data:`JOBS` on the spec file's params and arguments in this process (one
    rank of the group `runtime.setup` joins); the main process writes its result to the spec's
    ``result`` path."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in JOBS:
        print(f"usage: python -m tadm.experiments.jobs {{{','.join(JOBS)}}} SPEC.json   (normally under torchrun; "
              "see tadm.experiments.worker)", file=sys.stderr)
        return 2
    job, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    p = config.from_dict(spec["params"], source=spec_path)
    d = runtime.setup(p.runtime)
    with runtime.exit_on_rank_error():  # a failed process ends at once, entering no collective
        result = JOBS[job](p, d, spec["args"])
        if d.main and spec.get("result"):  # key order kept: the tables list rows in the result's order
            atomic_write_text(spec["result"], json.dumps(result, ensure_ascii=False))
        runtime.finish(d)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
