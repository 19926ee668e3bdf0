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
"""

import sys


def main() -> None:
    sys.modules.setdefault("rfc3987_syntax", None)  # absent: its import raises ImportError
    from papermill.cli import papermill

    papermill(prog_name="papermill")


if __name__ == "__main__":
    main()
