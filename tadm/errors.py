"""Errors the user can act on.

Every failure caused by bad input (a parameter, a file, a tensor) is raised as a
`TadmError` subclass whose message is one line naming the culprit. The CLI prints that line
and exits non-zero; it never shows a traceback for these.
"""


class TadmError(Exception):
    """An error caused by the user's input; its message is a single actionable line."""

    exit_code = 2


class ConfigError(TadmError):
    """A parameter in params.yaml (or a profile) is unknown, mistyped or out of range."""

    def __init__(self, key: str, message: str, source: str = "params.yaml"):
        self.key, self.detail, self.source = key, message, source
        super().__init__(f"{source}: {key}: {message}" if key else f"{source}: {message}")


class DataError(TadmError):
    """An input file or data set is missing, empty or malformed."""


class DependencyError(TadmError):
    """An installed package is older than the code path needs (e.g. transformers on a GPU image)."""
