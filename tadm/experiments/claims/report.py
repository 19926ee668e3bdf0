"""The claims table: ``paper_figures/claims.csv`` (one row per claim, every number),
``paper_figures/claims.md`` (the rules, the findings, the implementation checks, what the verdicts
rest on, the notes) and ``paper_figures/claims_summary.md`` (the README's results table)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from tadm.config import Params
from tadm.experiments.claims.catalog import CATALOG, evaluate
from tadm.experiments.claims.claim import DIRECTION, EQUIVALENCE, FINDING_VERDICTS, PASS, Claim, Entry
from tadm.experiments.claims.inputs import read_inputs
from tadm.experiments.claims.rules import Rules
from tadm.io import atomic_write_text


COLUMNS = ["id", "part", "claim", "paper", "this_run", "profile", "rule", "test", "verdict", "covers", "value", "se", "df",
           "paper_value", "margin", "n", "n_unit", "mde", "n_for_paper", "n_for_paper_unit", "family", "family_size",
           "p_reproduced", "p_contradicted", "p_reproduced_adjusted", "p_contradicted_adjusted", "source", "notes"]


def rows(cs: list[Claim]) -> list[dict]:
    """One row per claim, the CSV's columns (COLUMNS)."""
    out = []
    for c in cs:
        nfp = c.extra.get("n_for_paper") or (None, "")
        out.append({"id": c.id, "part": "finding" if c.finding else "check", "claim": c.claim, "paper": c.paper,
                    "this_run": c.shown or "–", "profile": c.extra.get("profile", ""), "rule": c.kind, "test": c.test,
                    "verdict": c.verdict, "covers": c.covers, "value": c.value, "se": c.se, "df": c.df,
                    "paper_value": c.paper_value, "margin": c.margin, "n": c.n, "n_unit": c.n_unit,
                    "mde": c.extra.get("mde"), "n_for_paper": nfp[0], "n_for_paper_unit": nfp[1],
                    **{k: c.extra.get(k) for k in ("family", "family_size", "p_reproduced", "p_contradicted",
                                                   "p_reproduced_adjusted", "p_contradicted_adjusted")},
                    "source": c.source, "notes": c.notes})
    return out


def tally(cs: list[Claim]) -> dict[str, int]:
    """Findings per verdict (implementation checks are not counted)."""
    return {v: sum(c.verdict == v for c in cs if c.finding) for v in FINDING_VERDICTS}


def _sens(c: Claim) -> str:
    m, nfp = c.extra.get("mde"), c.extra.get("n_for_paper")
    if m is None:
        return "–"
    text = f"{m:.3g}"
    if c.n is not None:
        text += f" at n = {c.n} {c.n_unit}" + (f" x {c.training_arms[0]} training runs" if c.training_arms else "")
    if nfp is not None:
        text += f"; n = {nfp[0]} {nfp[1]} for the paper's"
    return text


CAPTION = """Rules, fixed before any number is read (`tadm.experiments.claims`; params `claims`):
*implementation checks* are identities of the design (counted, exact: pass / fail) and are not counted;
*findings* get one of three rules, each a pair of one-sided tests. **Direction**: reproduced when the effect
is > 0 at level {ad:.4f} (beyond {z:g} se for a normal se), contradicted when < 0 at that level, else
inconclusive; speed findings are direction findings, the paper's GPU figure shown for reference only.
**Equivalence** (two one-sided tests at {ae:.2f} each): reproduced when the {lvl:.0%} interval of the
difference lies inside ±margin (accuracy {ma:g} pts, MAUVE {mm:g}, Gen PPL {mg:.0%}), contradicted when it
lies wholly outside, else inconclusive; **non-inferiority** is its one-sided half. Where the ± includes a
between-training-run variance its quantiles are Student's t at the stated df. **Several findings at once**
({fam}): findings resting on a common trained checkpoint form a family, and each side's p-values are
Holm-adjusted within it before the level is applied. **Not testable**: a precondition below failed (each
names the findings it gates). ± is the se of the difference itself; *covers* names its sources of variation,
training runs included where the finding compares separately trained models. *MDE*: the smallest effect (or
margin) this run detects with {pw:.0%} power, and the n that would detect the paper's effect (samples, or
training runs per arm where the training variance alone keeps samples from getting there)."""


def _md(text) -> str:
    """A Markdown table cell: its pipes escaped (KL(p || q) would split the row)."""
    return str(text).replace("|", "\\|")


def to_markdown(cs: list[Claim], pre: list[dict], profile: str, params: Params | None = None) -> str:
    cfg = (params.claims if params is not None else None)
    rules = Rules.of(params) if params is not None else Rules()
    t = tally(cs)
    fam = ("Holm's step-down" if rules.family_rule == "holm" else "none: each finding alone")
    lines = [f"# The paper's claims at the {profile} profile", "",
             CAPTION.format(z=rules.z, lvl=rules.equivalence_level, pw=rules.power, ad=rules.alpha(DIRECTION),
                            ae=rules.alpha(EQUIVALENCE), fam=fam,
                            ma=cfg.margin_accuracy_pts if cfg else 1.5, mm=cfg.margin_mauve if cfg else 0.05,
                            mg=cfg.margin_gen_ppl_rel if cfg else 0.05), "",
             "Findings: " + ", ".join(f"{n} {v}" for v, n in t.items()), "",
             "## Findings", "",
             "| claim | paper | this run | rule | ± covers | family | MDE | verdict |", "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        if c.finding:
            family = c.extra.get("family", "–")
            if c.extra.get("family_size", 1) > 1:
                family += (f" ({c.extra['family_size']} findings; adjusted p {c.extra['p_reproduced_adjusted']:.3g} / "
                           f"{c.extra['p_contradicted_adjusted']:.3g})")
            lines.append(f"| {_md(c.claim)} | {_md(c.paper)} | {_md(c.shown or '–')} | {c.kind}: {_md(c.test)} | "
                         f"{_md(c.covers or '–')} | {_md(family)} | {_sens(c)} | **{c.verdict}** |")
    checks = [c for c in cs if not c.finding]
    n_pass = sum(c.verdict == PASS for c in checks)
    lines += ["", f"## Implementation checks ({n_pass} of {len(checks)} pass; not findings)", "",
              "| check | design | this run | test | result |", "|---|---|---|---|---|"]
    lines += [f"| {_md(c.claim)} | {_md(c.paper)} | {_md(c.shown or '–')} | {_md(c.test)} | **{c.verdict}** |" for c in checks]
    if pre:
        lines += ["", "## What the verdicts rest on", "", "| check | this run | wanted | met | gates |", "|---|---|---|---|---|"]
        lines += [f"| {_md(r['check'])} | {_md(r['shown'])} | {_md(r['wanted'])} | {'yes' if r.get('passed') else 'no'} | "
                  f"{', '.join(r.get('gates') or ()) or '–'} |" for r in pre]
    notes = [c for c in cs if c.notes]
    if notes:
        lines += ["", "## Notes", ""] + [f"- `{c.id}`: {c.notes}" for c in notes]
    return "\n".join(lines) + "\n"


def summary_markdown(cs: list[Claim], profile: str) -> str:
    """The README's results table: one line per finding (paper, this run, verdict)."""
    t = tally(cs)
    lines = [f"Findings at the {profile} profile: " + ", ".join(f"{n} {v}" for v, n in t.items() if n) +
             " (rules and uncertainty: [paper_figures/claims.md](paper_figures/claims.md))", "",
             "| finding | paper | this run | verdict |", "|---|---|---|---|"]
    lines += [f"| {_md(c.claim)} | {_md(c.paper)} | {_md(c.shown or '–')} | {c.verdict} |" for c in cs if c.finding]
    return "\n".join(lines) + "\n"


def write(p: Params, root: Path = Path("."), out: Path = Path("paper_figures"),
          catalog: Sequence[Entry] = CATALOG) -> list[Claim]:
    """The claims of `catalog` evaluated on the run under `root`, written to `out` (claims.csv,
    claims.md, claims_summary.md)."""
    inp = read_inputs(p, root)
    cs, pre = evaluate(inp, catalog)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows(cs))
    atomic_write_text(out / "claims.csv", buf.getvalue())
    atomic_write_text(out / "claims.md", to_markdown(cs, pre, p.profile, p))
    atomic_write_text(out / "claims_summary.md", summary_markdown(cs, p.profile))
    return cs

