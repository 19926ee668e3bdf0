"""Tests of the tasks: code-scoring tests need the sandbox's namespaces.

Where this machine genuinely cannot create them (checked here with util-linux `unshare`, apart
from the sandbox's own code), a test that reaches the sandbox's refusal is skipped with the
reason instead of failing. Where they can be created, a refusal is a real failure.
"""

import os
import shutil
import subprocess
from functools import lru_cache

import pytest

from tadm.tasks import sandbox


@lru_cache(maxsize=1)
def namespaces_unavailable() -> str | None:
    """Why `unshare` cannot make mount + pid + net namespaces here (None if it can)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "util-linux `unshare` is not installed"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    tries = [[unshare, *user, "--mount", "--pid", "--net", "--fork", "--mount-proc", "true"]]
    if os.geteuid() == 0:  # root without the capabilities may still get a user namespace
        tries.append([unshare, "--user", "--map-root-user", "--mount", "--pid", "--net", "--fork", "--mount-proc", "true"])
    why = ""
    for argv in tries:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            why = str(e)
            continue
        if done.returncode == 0:
            return None
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return why


@pytest.fixture(autouse=True)
def _skip_where_code_cannot_be_isolated(monkeypatch):
    if namespaces_unavailable() is not None:
        def skip(why: str) -> None:
            pytest.skip(f"this machine cannot create the sandbox's namespaces ({namespaces_unavailable()}); "
                        f"the sandbox refuses to run generated code here ({why})")

        monkeypatch.setattr(sandbox, "_refuse", skip)
    yield
