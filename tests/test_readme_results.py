"""The README's results table is the claims stage's own summary (paper_figures/claims_summary.md,
written by `python -m tadm claims` from the committed run), copied between two markers: a
figure in it cannot drift from the run."""

import re

from tadm.config import ROOT


def test_the_readme_results_table_is_the_committed_claims_summary():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- claims_summary:begin -->\n(.*?)<!-- claims_summary:end -->", readme, re.S)
    assert m, "README.md has no <!-- claims_summary:begin/end --> block"
    assert m.group(1) == (ROOT / "paper_figures" / "claims_summary.md").read_text()
