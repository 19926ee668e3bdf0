"""The README's results table is the claims stage's own summary (paper_figures/claims_summary.md,
written by `python -m tadm claims` from the committed run), copied between two markers: a
figure in it cannot drift from the run. Both files are read as committed at git HEAD
(tests/committed.py): a rerun's uncommitted outputs, whose throughput cell moves with the
machine's speed, are not the run the README quotes."""

import re

from committed import read_text, where


def test_the_readme_results_table_is_the_committed_claims_summary():
    readme = read_text("README.md")
    m = re.search(r"<!-- claims_summary:begin -->\n(.*?)<!-- claims_summary:end -->", readme, re.S)
    assert m, f"README.md (read from {where('README.md')}) has no <!-- claims_summary:begin/end --> block"
    summary = "paper_figures/claims_summary.md"
    assert m.group(1) == read_text(summary), (
        f"README.md's results block (read from {where('README.md')}) is not {summary} (read from {where(summary)}): "
        "copy the summary between the markers and commit the two together")
