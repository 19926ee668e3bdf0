"""tests/hub: torch single-threaded (bit-for-bit comparisons, tiny ops); one exported workspace
per module where a module asks for it (`hub_workspace`)."""

import pytest

from tests.conftest import torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)


@pytest.fixture(scope="module")
def hub_workspace(tmp_path_factory):
    """(workspace root, {run: exported hub directory}) for every run of `workspace.RUNS`."""
    from tests.hub.workspace import export_all, make_workspace

    root = make_workspace(tmp_path_factory.mktemp("workspace"))
    return root, export_all(root)
