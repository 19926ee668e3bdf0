"""The claims table: ``paper_figures/claims.csv`` (one row per claim, every number),
``paper_figures/claims.md`` (the rules, the paper's claims, the mechanism checks, the
implementation checks, what the verdicts rest on, the notes), ``paper_figures/claims_summary.md``
(the README's results table) and ``paper_figures/claims_inputs.json`` (every number the verdicts
read, from which `write_from` rewrites the other three byte for byte)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from tadm.config import Params
from tadm.experiments.claims.catalog import CATALOG, evaluate
from tadm.experiments.claims.claim import DIRECTION, EQUIVALENCE, FINDING_VERDICTS, PASS, UNDERPOWERED, Claim, Entry
from tadm.experiments.claims.inputs import Inputs, read_inputs
from tadm.experiments.claims.rules import Rules, target
from tadm.io import atomic_write_text


COLUMNS = ["id", "part", "claim", "paper", "this_run", "profile", "rule", "test", "verdict", "covers", "value", "se", "df",
           "paper_value", "margin", "n", "n_unit", "mde", "power_target", "power_target_is", "n_for_paper",
           "n_for_paper_unit", "measured_over_bound", "family", "family_size", "p_reproduced", "p_contradicted",
           "p_reproduced_adjusted", "p_contradicted_adjusted", "source", "notes"]


def _part(c: Claim) -> str:
    return "check" if not c.finding else "mechanism" if c.mechanism else "finding"


def rows(cs: list[Claim]) -> list[dict]:
    """One row per claim, the CSV's columns (COLUMNS)."""
    out = []
    for c in cs:
        nfp = c.extra.get("n_for_paper") or (None, "")
        tgt = target(c) if c.finding else None
        out.append({"id": c.id, "part": _part(c), "claim": c.claim, "paper": c.paper,
                    "this_run": c.shown or "–", "profile": c.extra.get("profile", ""), "rule": c.kind, "test": c.test,
                    "verdict": c.verdict, "covers": c.covers, "value": c.value, "se": c.se, "df": c.df,
                    "paper_value": c.paper_value, "margin": c.margin, "n": c.n, "n_unit": c.n_unit,
                    "mde": c.extra.get("mde"), "power_target": tgt[0] if tgt else None,
                    "power_target_is": tgt[1] if tgt else "", "n_for_paper": nfp[0], "n_for_paper_unit": nfp[1],
                    "measured_over_bound": c.extra.get("measured_over_bound"),
                    **{k: c.extra.get(k) for k in ("family", "family_size", "p_reproduced", "p_contradicted",
                                                   "p_reproduced_adjusted", "p_contradicted_adjusted")},
                    "source": c.source, "notes": c.notes})
    return out


def tally(cs: list[Claim], mechanism: bool = False) -> dict[str, int]:
    """The paper's claims per verdict (`mechanism`: the mechanism checks'); implementation checks
    are not counted."""
    return {v: sum(c.verdict == v for c in cs if c.finding and c.mechanism == mechanism) for v in FINDING_VERDICTS}


def _sens(c: Claim) -> str:
    m, nfp = c.extra.get("mde"), c.extra.get("n_for_paper")
    if m is None:
        return "–"
    text = f"{m:.3g}"
    if c.n is not None:
        text += f" at n = {c.n} {c.n_unit}" + (f" x {c.training_arms[0]} training runs" if c.training_arms else "")
    tgt = target(c)
    if tgt is not None:
        text += f" {'>' if m > tgt[0] else '<='} {tgt[0]:.3g}, {tgt[1]}"
    if nfp is not None:
        text += f"; n = {nfp[0]} {nfp[1]} for the paper's"
    return text


CAPTION = """Rules, fixed before any number is read (`tadm.experiments.claims`; params `claims`):
*implementation checks* are identities of the design (counted, exact: pass / fail) and are not counted;
*the paper's claims* and *mechanism checks* (what Sec. 3 says happens inside the model; tested alone, never
in a claim's family, not in the tally) get one of three rules, each a pair of one-sided tests. **Power first**
({power_rule}): before the effect is read, a finding whose minimum detectable effect at this run's n (MDE:
(crit + power quantile) x se, from the se alone) exceeds its target -- the equivalence margin; the paper's effect
of a direction finding, else the metric's margin; the margin plus the paper's improvement for non-inferiority --
is **underpowered at this profile**, with the n that would decide it. **Direction**: reproduced when the effect
is > 0 at level {ad:.4f} (beyond {z:g} se for a normal se), contradicted when < 0 at that level, else
inconclusive. **Speed** findings are direction findings judged on their size too: reproduced only when
measured / FLOP-bound lies in [{blo:g}, {bhi:g}] (else inconclusive), the paper's own measured / bound at its
settings printed beside. **Equivalence** (two one-sided tests at {ae:.2f} each): reproduced when the {lvl:.0%}
interval of the difference lies inside ±margin (accuracy {ma:g} pts, MAUVE {mm:g}, Gen PPL {mg:.0%}), contradicted
when it lies wholly outside, else inconclusive; **non-inferiority** is its one-sided half. Where the ± includes
a between-training-run variance its quantiles are Student's t at the stated df. **Several findings at once**
({fam}): each finding's family is declared in the catalog, and each side's p-values are Holm-adjusted within it
before the level is applied, m the declared size (a member not tested counts as p = 1). **Not testable**: a
precondition below failed (each names the findings it gates). ± is the se of the difference itself; *covers*
names its sources of variation, training runs included where the finding compares separately trained models.
*MDE* against its target, and the n that would detect the paper's effect with {pw:.0%} power (samples, or
training runs per arm where the training variance alone keeps samples from getting there)."""


def _md(text) -> str:
    """A Markdown table cell: its pipes escaped (KL(p || q) would split the row)."""
    return str(text).replace("|", "\\|")


def _tally_text(t: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in t.items())


def _finding_rows(cs: list[Claim]) -> list[str]:
    lines = ["| claim | paper | this run | rule | ± covers | family | MDE | verdict |", "|---|---|---|---|---|---|---|---|"]
    for c in cs:
        family = c.extra.get("family", "–")
        if c.extra.get("family_size", 1) > 1:
            family += f" ({c.extra['family_size']} findings"
            if "p_reproduced_adjusted" in c.extra:
                family += (f"; adjusted p {c.extra['p_reproduced_adjusted']:.3g} / "
                           f"{c.extra['p_contradicted_adjusted']:.3g}")
            family += ")"
        lines.append(f"| {_md(c.claim)} | {_md(c.paper)} | {_md(c.shown or '–')} | {c.kind}: {_md(c.test)} | "
                     f"{_md(c.covers or '–')} | {_md(family)} | {_md(_sens(c))} | **{c.verdict}** |")
    return lines


def to_markdown(cs: list[Claim], pre: list[dict], profile: str, params: Params | None = None) -> str:
    cfg = (params.claims if params is not None else None)
    rules = Rules.of(params) if params is not None else Rules()
    fam = ("Holm's step-down" if rules.family_rule == "holm" else "none: each finding alone")
    claims_, mechanisms = [c for c in cs if c.paper_claim], [c for c in cs if c.finding and c.mechanism]
    lines = [f"# The paper's claims at the {profile} profile", "",
             CAPTION.format(z=rules.z, lvl=rules.equivalence_level, pw=rules.power, ad=rules.alpha(DIRECTION),
                            ae=rules.alpha(EQUIVALENCE), fam=fam, blo=rules.speed_bound_lo, bhi=rules.speed_bound_hi,
                            power_rule="claims.power_rule: mde" if rules.power_rule == "mde" else "off: not applied",
                            ma=cfg.margin_accuracy_pts if cfg else 1.5, mm=cfg.margin_mauve if cfg else 0.05,
                            mg=cfg.margin_gen_ppl_rel if cfg else 0.05), "",
             "The paper's claims: " + _tally_text(tally(cs)), "",
             "## The paper's claims", ""] + _finding_rows(claims_)
    if mechanisms:
        lines += ["", "## Mechanism checks (not the paper's comparative claims; not counted above)", "",
                  "Mechanism checks: " + _tally_text({v: n for v, n in tally(cs, mechanism=True).items() if n}), ""]
        lines += _finding_rows(mechanisms)
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
    """The README's results table: one line per claim of the paper (paper, this run, verdict), the
    mechanism checks in one line below it."""
    t = tally(cs)
    lines = [f"The paper's claims at the {profile} profile: " + ", ".join(f"{n} {v}" for v, n in t.items() if n) +
             " (rules and uncertainty: [paper_figures/claims.md](paper_figures/claims.md))", "",
             "| finding | paper | this run | verdict |", "|---|---|---|---|"]
    lines += [f"| {_md(c.claim)} | {_md(c.paper)} | {_md(c.shown or '–')} | {c.verdict} |" for c in cs if c.paper_claim]
    mech = [c for c in cs if c.finding and c.mechanism]
    if mech:
        lines += ["", "Mechanism checks (Sec. 3; not counted): " + "; ".join(f"{_md(c.claim)}: {c.verdict}" for c in mech)]
    under = [c for c in cs if c.paper_claim and c.verdict == UNDERPOWERED]
    if under:
        lines += ["", "*Underpowered* is decided from the se alone, before the effect is read: the run could not have "
                  "detected the paper's effect (or shown equivalence); *inconclusive*: it could have, and did not."]
    return "\n".join(lines) + "\n"


def _write_outputs(cs: list[Claim], pre: list[dict], p: Params, out: Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows(cs))
    atomic_write_text(out / "claims.csv", buf.getvalue())
    atomic_write_text(out / "claims.md", to_markdown(cs, pre, p.profile, p))
    atomic_write_text(out / "claims_summary.md", summary_markdown(cs, p.profile))


INPUTS_FILE = "claims_inputs.json"


def write(p: Params, root: Path = Path("."), out: Path = Path("paper_figures"),
          catalog: Sequence[Entry] = CATALOG) -> list[Claim]:
    """The claims of `catalog` evaluated on the run under `root`, written to `out` (claims.csv,
    claims.md, claims_summary.md) with every number they read (claims_inputs.json)."""
    inp = read_inputs(p, root)
    cs, pre = evaluate(inp, catalog)
    _write_outputs(cs, pre, p, out)
    atomic_write_text(out / INPUTS_FILE, inp.to_json())
    return cs


def write_from(inputs: Path, out: Path, catalog: Sequence[Entry] = CATALOG) -> list[Claim]:
    """The claims recomputed from a claims inputs file alone (`Inputs.from_json`), written to `out`
    (claims.csv, claims.md, claims_summary.md): byte-identical to the stage's when nothing changed."""
    inp = Inputs.from_json(inputs)
    cs, pre = evaluate(inp, catalog)
    _write_outputs(cs, pre, inp.params, out)
    return cs
