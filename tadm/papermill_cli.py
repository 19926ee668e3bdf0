"""papermill's command line, started without one optional import that costs it 3 seconds.

papermill reads and writes notebooks with nbformat, which imports jsonschema; jsonschema imports
the optional ``rfc3987_syntax`` whenever it is installed (jupyterlab's jupyter-events pulls it in),
and that module compiles a Lark grammar at import: 3.1 of the 4.7 s papermill takes to start on
this project's 2-core machines, paid by every notebook stage of the pipeline. jsonschema uses it
only for its "iri" format checker, and nbformat validates notebooks without format checkers, so
this entry point marks the module absent (``sys.modules[name] = None`` makes importing it raise
ImportError, which jsonschema expects of a missing optional module) and then runs papermill's own
CLI with the arguments unchanged::

    python -m tadm.papermill_cli notebooks/sample.ipynb out.ipynb -p row tadm   # = papermill ...

The pipeline's stages keep ``papermill ...`` as their command; ``tadm.stage_times`` starts it
through here. The notebook kernel never imports jsonschema, so nothing else changes.

Two things differ from papermill's own CLI, both about errors: a parameter the notebook does not
declare (``-p profile paper`` where papermill would only warn and run the params file's profile)
is refused before the kernel starts, and a notebook cell that failed with a one-line error
(``tadm.config.notebook.one_line_errors``: a bad parameter, a missing input) is printed as that
line, ``error: ...``, with exit status 2 instead of papermill's traceback. Other failures keep
papermill's report.
"""

import logging
import sys

UNKNOWN = "Passed unknown parameter: "


class UnknownParameter(Exception):
    pass


class _RefuseUnknown(logging.Filter):
    """papermill logs "Passed unknown parameter: <name>" and runs on; stop it there instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(UNKNOWN):
            raise UnknownParameter(message[len(UNKNOWN):])
        return True


def main() -> None:
    sys.modules.setdefault("rfc3987_syntax", None)  # absent: its import raises ImportError
    from papermill.cli import papermill  # lazy: must follow the sys.modules line above (rfc3987_syntax marked absent first)
    # lazy: must follow the sys.modules line above (rfc3987_syntax marked absent first)
    from papermill.exceptions import PapermillExecutionError

    logging.getLogger("papermill").addFilter(_RefuseUnknown())
    try:
        papermill(prog_name="papermill")
    except UnknownParameter as e:
        # lazy: tadm.config (+ yaml, ~60 ms) only to report a failure; every notebook stage starts here
        from tadm.config.notebook import SOURCE

        hint = ("; the profile is the params file's: render another with python -m tadm profile NAME" if str(e) == "profile"
                else "")
        sys.exit(_error(f"{SOURCE}: {e}: the notebook has no such parameter (papermill would ignore it){hint}"))
    except PapermillExecutionError as e:
        # lazy: tadm.config (+ yaml, ~60 ms) only to report a failure; every notebook stage starts here
        from tadm.config.notebook import one_line

        if list(e.traceback or ()) == [one_line(e.ename, e.evalue)]:
            sys.exit(_error(e.evalue))
        raise


def _error(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    main()
