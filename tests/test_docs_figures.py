"""Figures the README and docs/ quote from the committed run equal the committed files they come
from: each quoted figure is registered here with its source (a file the pipeline wrote under
metrics/, results/ or paper_figures/, or a benchmark's own result under benchmarks/results/, and
a key in it) and the format it is quoted in, and must appear in its document as formatted from the
source. A commit that moves a number fails here, naming the document, the quote expected and the
files it was formatted from, until the prose is updated.

The documents and their sources are read as committed at git HEAD (tests/committed.py): `make
reproduce` rewrites the outputs in the working copy, and an honest rerun moves every timing, so the
working copy's outputs after a rerun are not the run the prose quotes. A developer who updates
outputs and prose commits them together (tests/requote_docs.py rewrites the quotes that moved); a fresh clone's working copy is HEAD
(tests/test_docs_after_rerun.py: the checks pass after a rerun's timings, fail on a commit that
moves a figure). Outside a git checkout the working copy is read.

What is not registered is not a run figure: design constants and parameters (d = 128, 1000 steps),
the paper's own numbers, and measurements made outside the pipeline, which the prose dates
(the README's AVX2-only `make reproduce`, the suite's time).

The README's results table is checked whole elsewhere (tests/test_readme_results.py)."""

import csv
import difflib
import io
import json
import math
import re
import statistics
from functools import lru_cache

import pytest
import yaml

from committed import read_text, where

RUNS = ("mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar")
# Table 2's diffusion rows (metrics/table2.json prefixes), ADLM and the fusion's ablation apart
DIFFUSION_ROWS = ("sedd", "mdlm", "mdlm_fb", "mdlm_dfm", "remdm", "tadm_gamma0", "tadm")
BUDGETS = ("T64", "T128")

# the files read while one quote is formatted (named in its failure message)
_read: list[str] = []


def _note(path: str) -> str:
    _read.append(path)
    return path


# --- sources ---------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _json(path: str) -> dict:
    return json.loads(read_text(path))


def source(path: str) -> dict:
    """A JSON file the pipeline (or a benchmark) wrote."""
    return _json(_note(path))


@lru_cache(maxsize=None)
def _csv(path: str) -> tuple:
    return tuple(csv.DictReader(io.StringIO(read_text(path), newline="")))


def rows(path: str) -> tuple:
    """The rows of a CSV file the pipeline wrote, as dicts of strings."""
    return _csv(_note(path))


def params(*keys: str):
    """A key of params.yaml, the run's parameters (DVC tracks them)."""
    value = yaml.safe_load(read_text(_note("params.yaml")))
    for k in keys:
        value = value[k]
    return value


def train(run: str, key: str) -> float:
    return source(f"metrics/train/{run}.json")[key]


def train_eval(run: str, step: int) -> float:
    """Validation NELBO of a Table 2 run at one evaluation step (metrics/train/<run>_eval.csv)."""
    return float(next(r for r in rows(f"metrics/train/{run}_eval.csv") if int(r["step"]) == step)["val_nelbo"])


def judge(*keys: str) -> float:
    value = source("metrics/evaluator.json")
    for k in keys:
        value = value[k]
    return value


def jobs(key: str):
    """The train stage's job pool (metrics/train/jobs.json)."""
    return source("metrics/train/jobs.json")[key]


def table1(key: str) -> float:
    """A figure of the committed Table 1 (metrics/table1.json; keys without the task prefix)."""
    return source("metrics/table1.json")[f"arithmetic_{key}"]


def table1_row(method: str) -> dict:
    """A row of paper_figures/table1.csv (its ± columns), numbers as floats where they are."""
    row = next(r for r in rows("paper_figures/table1.csv") if r["method"] == method)
    return {k: _float(v) for k, v in row.items()}


def against_tadm(family: str, sign=None) -> str:
    """A Table 1 family's accuracy against TADM at K = 2 and 3 as the prose writes it:
    "<delta> ± <se> and <delta> ± <se>" (`sign`: how a delta is written, :func:`signed` by default)."""
    sign = sign or signed
    return " and ".join(f"{sign(r['delta_tadm_pts'])} ± {r['delta_tadm_se']:.1f}"
                        for r in (table1_row(f"{family} K={K}") for K in (2, 3)))


def table2(row: str, budget: str, key: str) -> float:
    """A cell of the committed Table 2 (metrics/table2.json)."""
    return source("metrics/table2.json")[f"{row}_{budget}_{key}"]


def asrd(key: str) -> float:
    """A figure of the committed ASRD comparison (metrics/asrd.json)."""
    return source("metrics/asrd.json")[key]


def staleness(age: int) -> dict:
    """A cache age's row of paper_figures/anchor_staleness.csv."""
    return {k: _float(v) for k, v in next(r for r in rows("paper_figures/anchor_staleness.csv")
                                           if int(r["age"]) == age).items()}


def sweep(policy: str) -> dict:
    """A row of the refresh sweep (paper_figures/refresh_sweep.csv)."""
    return {k: _float(v) for k, v in next(r for r in rows("paper_figures/refresh_sweep.csv")
                                           if r["policy"] == policy).items()}


def stage_minutes(name: str | None = None) -> float:
    """Minutes of one stage (None: all of them) of the committed run."""
    return stage_seconds(name) / 60


def stage_seconds(name: str | None = None) -> float:
    times = source("metrics/stage_times.json")
    return times["total_seconds"] if name is None else times["stages"][name]["seconds"]


def run_date() -> str:
    """The day the committed run started (metrics/stage_times.json)."""
    return min(s["started"] for s in source("metrics/stage_times.json")["stages"].values())[:10]


def claim(cid: str) -> dict:
    """A row of the claims table the pipeline wrote (paper_figures/claims.csv), numbers as floats."""
    row = next(r for r in rows("paper_figures/claims.csv") if r["id"] == cid)
    return {**row, **{k: float(row[k]) for k in ("value", "se", "n", "mde")}}


def verdicts() -> str:
    """The findings' verdict counts as the claims stage words them."""
    found = [r["verdict"] for r in rows("paper_figures/claims.csv") if r["part"] == "finding"]
    return ", ".join(f"{found.count(v)} {v}" for v in ("reproduced", "contradicted", "inconclusive",
                                                       "underpowered at this profile"))


def verdict_of(*cids: str) -> str:
    """The verdict of claims the prose words together ("inconclusive", or each one where they differ)."""
    found = list(dict.fromkeys(claim(c)["verdict"] for c in cids))
    return " and ".join(found)


# --- benchmark results (benchmarks/results/*.md tables) --------------------------------------

@lru_cache(maxsize=None)
def _md_tables(path: str) -> tuple:
    """Every pipe table of a Markdown file: (the last line of text before it, header, rows)."""
    tables, before, lines = [], "", read_text(path).splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            tables.append((before, block[0], [r for r in block[2:]]))
        else:
            if lines[i].strip():
                before = lines[i].strip()
            i += 1
    return tuple(tables)


def md_cell(path: str, row, col, section: str | None = None) -> str:
    """The cell of a benchmark's Markdown table in the row whose leading cells are `row` (a cell's
    text up to its first " (" will do) and the column whose header starts with `col` (or the
    column index); `section`: a text in the line just above the table."""
    want = (row,) if isinstance(row, str) else tuple(row)
    for before, header, body in _md_tables(_note(path)):
        if section is not None and section not in before:
            continue
        j = col if isinstance(col, int) else next((k for k, h in enumerate(header) if h.startswith(col)), None)
        if j is None:
            continue
        for r in body:
            if all(c == w or c.startswith(w + " (") for c, w in zip(r, want)):
                return r[j]
    raise KeyError(f"{path}: no row {want} and column {col!r}" + (f" under {section!r}" if section else ""))


def num(cell: str, i: int = 0) -> float:
    """The i-th number in a table cell ("3.192 (+1.04)": 0 -> 3.192, 1 -> 1.04)."""
    return float(re.findall(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", cell)[i].replace(",", ""))


LR = "benchmarks/results/default_scale_lr.md"
B2 = "β2 = 0.95"          # the β2 table's columns
B999 = "β2 = 0.999"


def lr_run(setting: str, step: str = "1000", i: int = 0) -> float:
    """NELBO (i = 0) or nats below the line (i = 1) of a run of benchmarks/results/default_scale_lr.md."""
    return num(md_cell(LR, setting, step), i)


# --- formats ---------------------------------------------------------------------------------

def _float(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def signed(x: float, digits: int = 1) -> str:
    """x as the prose writes it: a typographic minus."""
    return f"{x:.{digits}f}".replace("-", "\u2212")


def plus(x: float, digits: int = 1) -> str:
    """x with its sign always written (+0.0 for a zero), a typographic minus."""
    s = f"{x:+.{digits}f}"
    if float(s) == 0:
        s = "+" + s[1:]
    return s.replace("-", "\u2212")


def span(lo: float, hi: float, fmt: str = ".2f", dash: str = "–") -> str:
    """A range as the prose writes it: one number where both ends format alike."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}{dash}{b}"


def pct_change(log_ratio: float) -> str:
    """A log ratio as the claims stage words it: +22.4 %."""
    return f"{100 * math.expm1(log_ratio):+.1f} %".replace("-", "\u2212")


def text(doc: str) -> str:
    """The document with every run of whitespace as one space (quotes may wrap lines)."""
    return re.sub(r"\s+", " ", read_text(doc))


# --- the registry: (document, what is quoted, the quote as formatted from its sources) ---------

DP = "docs/default-profile.md"

FIGURES = [
    # README.md (the results table between the claims_summary markers: tests/test_readme_results.py)
    ("README.md", "the run's stage time",
     lambda: f"| `make reproduce` (default profile, every stage from scratch) | {stage_minutes():.1f} minutes"),
    ("README.md", "ASRD's speed on the masked model against low-confidence and its threshold base",
     lambda: f"ASRD runs at {asrd('arithmetic_masked_ASRD_speedup_x'):.2f}x (arithmetic) and "
             f"{asrd('spelling_masked_ASRD_speedup_x'):.2f}x (numbers in words) the speed of low-confidence "
             f"remasking; its own threshold base runs at {asrd('arithmetic_masked_Lowconfidencethreshold_speedup_x'):.2f}x "
             f"and {asrd('spelling_masked_Lowconfidencethreshold_speedup_x'):.2f}x"),
    ("README.md", "ASRD's accuracy against its threshold base on the masked model",
     lambda: "accuracy " + " and ".join(
         plus(asrd(f"{t}_masked_ASRD_accuracy") - asrd(f"{t}_masked_Lowconfidencethreshold_accuracy"))
         for t in ("arithmetic", "spelling")) + " points against that base"),
    ("README.md", "naive reuse: TADM's completion and its accuracy against TADM",
     lambda: f"on {100 * table1('NaivereuseK2_same_output_as_tadm'):.0f} % (K = 2) and "
             f"{100 * table1('NaivereuseK3_same_output_as_tadm'):.0f} % (K = 3) of the example-seeds and scores "
             f"{signed(table1('NaivereuseK2_delta_tadm_pts'))} and {signed(table1('NaivereuseK3_delta_tadm_pts'))} "
             "points against it"),
    ("README.md", "the feature cache: accuracy and speed against TADM's",
     lambda: f"scores {plus(table1('FeaturecacheK2_delta_tadm_pts'))} and {plus(table1('FeaturecacheK3_delta_tadm_pts'))} "
             f"points against it but runs at {table1('FeaturecacheK2_throughput_x'):.2f}x and "
             f"{table1('FeaturecacheK3_throughput_x'):.2f}x the base's speed against TADM's "
             f"{table1('TADMK2_throughput_x'):.2f}x and {table1('TADMK3_throughput_x'):.2f}x"),
    ("README.md", "TADM against each training-free cache",
     lambda: f"{signed(claim('fusion_vs_naive')['value'])} ± {claim('fusion_vs_naive')['se']:.1f} points against naive "
             f"reuse and {signed(claim('fusion_vs_feature')['value'])} ± {claim('fusion_vs_feature')['se']:.1f} against "
             f"the feature cache (TADM's accuracy minus the cache's, K = 3, {claim('fusion_vs_feature')['n']:.0f} "
             "problems)"),
    ("README.md", "papermill_cli's head start (the papermill_start benchmark)",
     lambda: "started {:.0f} s sooner".format(
         num(md_cell("benchmarks/results/papermill_start.md", "`papermill`", "median"))
         - num(md_cell("benchmarks/results/papermill_start.md", "`tadm.papermill_cli`", "median")))),

    # docs/default-profile.md: what each model learnt
    (DP, "nats below the unigram line, every run",
     lambda: f"| nats below the unigram line after {params('train', 'steps')} steps | "
             + " | ".join(f"{train(r, 'below_unigram'):.2f}" for r in RUNS) + " |"),
    (DP, "the unigram entropy of the validation tokens",
     lambda: f"unigram entropy of the validation tokens {train('mdlm', 'unigram_entropy'):.3f} nats/token"),
    (DP, "ADLM against the line",
     lambda: f"({train('adlm', 'below_unigram'):.4f} nats below: {train('adlm', 'val_nelbo'):.3f} against "
             f"{train('adlm', 'unigram_entropy'):.3f}"),
    (DP, "validation NELBOs on this machine",
     lambda: f"validation NELBO: MDLM {train('mdlm', 'val_nelbo'):.3f}, TADM† {train('tadm_gamma0', 'val_nelbo'):.3f}, "
             f"SEDD {train('sedd', 'val_nelbo'):.3f})"),
    (DP, "ADLM and MDLM at step 200",
     lambda: f"at step 200 ADLM's validation NELBO is {train_eval('adlm', 200):.3f} against MDLM's "
             f"{train_eval('mdlm', 200):.3f}"),

    # docs/default-profile.md: β2, the lr and ADLM's plateau (benchmarks/results/default_scale_lr.md)
    (DP, "β2 = 0.95 against 0.999, every model measured (the β2 benchmark)",
     lambda: f"β2 = 0.95 ends MDLM {num(md_cell(LR, ('MDLM', '0'), B2), 1):.2f} nats below the unigram line "
             f"against {num(md_cell(LR, ('MDLM', '0'), B999), 1):.2f} with 0.999, "
             f"SEDD {num(md_cell(LR, ('SEDD', '0'), B2), 1):.2f} against {num(md_cell(LR, ('SEDD', '0'), B999), 1):.2f}, "
             f"TADM† {num(md_cell(LR, ('TADM†', '0'), B2), 1):.2f} against "
             f"{num(md_cell(LR, ('TADM†', '0'), B999), 1):.2f}, ADLM {num(md_cell(LR, ('ADLM', '0'), B2), 1):.2f} "
             f"against {num(md_cell(LR, ('ADLM', '0'), B999), 1):.2f} (seed 0) and "
             f"{num(md_cell(LR, ('ADLM', '1'), B2), 1):.2f} against {num(md_cell(LR, ('ADLM', '1'), B999), 1):.2f} (seed 1)"),
    (DP, "the two ADLM seeds' spread under each β2 (the β2 benchmark)",
     lambda: "the two ADLM seeds end {:.2f} apart instead of {:.2f}".format(
         abs(num(md_cell(LR, ("ADLM", "0"), B2)) - num(md_cell(LR, ("ADLM", "1"), B2))),
         abs(num(md_cell(LR, ("ADLM", "0"), B999)) - num(md_cell(LR, ("ADLM", "1"), B999))))),
    (DP, "lr 1e-3 against 1.5e-3 (the lr benchmark)",
     lambda: f"MDLM {lr_run('v300'):.3f} against {lr_run('v300_lr1.5e-3'):.3f}, TADM† {lr_run('v300_tadm_gamma0'):.3f} "
             f"against {lr_run('v300_tadm_gamma0_lr1.5e-3'):.3f}, ADLM {lr_run('v300_adlm'):.3f} against "
             f"{lr_run('v300_adlm_lr1.5e-3'):.3f} (7e-4 gave ADLM {lr_run('v300_adlm_lr7e-4'):.3f})"),
    (DP, "ADLM on two machines' float paths (the lr and β2 benchmarks)",
     lambda: f"(ADLM {lr_run('v300_adlm'):.3f} on the AVX-512 machine, "
             f"{num(md_cell(LR, ('ADLM', '0'), B999)):.3f} on an AVX2-only one"),
    (DP, "every ADLM run's step-200 plateau against MDLM and TADM† (the lr and β2 benchmarks)",
     lambda: (lambda adlm, others: f"Every ADLM run sits at {span(min(adlm)[0], max(adlm)[0])} nats at step 200, "
                                   f"{span(min(a[1] for a in adlm), max(a[1] for a in adlm))} below the line, while "
                                   f"MDLM and TADM† are at {span(min(others), max(others))}")(
         [(num(c), num(c, 1)) for c in
          [md_cell(LR, s, "step 200") for s in ("v300_adlm", "v300_adlm_seed1", "v300_adlm_lr1.5e-3_seed1",
                                                 "v300_adlm_lr7e-4", "v300_adlm_1500", "v300_adlm_1500_seed1",
                                                 "ADLM with its anchor output layer kaiming-initialised instead of zero",
                                                 "v300_adlm_lr1.5e-3", "v300_adlm_b95", "v300_adlm_b95_seed1")]],
         [num(md_cell(LR, s, "step 200")) for s in ("v300", "v300_tadm_gamma0", "v300_lr1.5e-3",
                                                    "v300_tadm_gamma0_lr1.5e-3", "v300_mdlm_b95",
                                                    "v300_tadm_gamma0_b95")])),
    (DP, "ADLM's 1000-step runs under every lr, seed and β2 (the lr and β2 benchmarks)",
     lambda: f"it ended {lr_run('v300_adlm', i=1):.2f} below the line (lr 1e-3, seed 0), "
             f"{lr_run('v300_adlm_seed1', i=1):.2f} (seed 1), {lr_run('v300_adlm_lr1.5e-3_seed1', i=1):.2f} and "
             f"{lr_run('v300_adlm_lr1.5e-3', i=1):.2f} at lr 1.5e-3 (seeds 1, 0), "
             f"{lr_run('v300_adlm_lr7e-4', i=1):.2f} at 7e-4; at β2 = 0.95, {lr_run('v300_adlm_b95', i=1):.2f} and "
             f"{lr_run('v300_adlm_b95_seed1', i=1):.2f} (seeds 0, 1)"),
    (DP, "ADLM trained longer (the lr benchmark)",
     lambda: f"a 1500-step cosine ended {lr_run('v300_adlm_1500', '1500', 1):.2f} below the line, a 2000-step one "
             f"{lr_run('v300_adlm_2000', '2000', 1):.2f}"),
    (DP, "ADLM with a kaiming-initialised anchor output layer (the lr benchmark)",
     lambda: "a kaiming-initialised 1000-step run was {:.2f} below the line at step 800, against {:.2f}".format(
         lr_run("ADLM with its anchor output layer kaiming-initialised instead of zero", "800", 1),
         lr_run("v300_adlm", "800", 1))),

    # docs/default-profile.md: the claims table
    (DP, "the findings' verdicts",
     lambda: f"In the committed run {verdicts().replace('reproduced', 'findings are reproduced', 1)}"),
    (DP, "the judge's NLL against AR's",
     lambda: f"validation NLL {judge('val_nll'):.3f} nats/token on the AR model's own tokens against AR's "
             f"{train('ar', 'val_nelbo'):.3f}"),
    (DP, "the judge's size and training",
     lambda: f"({params('eval', 'trained', 'n_layers')} layers, {judge('steps')} steps;"),
    (DP, "the judge's checks",
     lambda: f"MAUVE {judge('sanity', 'mauve_data_shuffled'):.3f}, a "
             f"{judge('sanity', 'shuffled_ppl_ratio_per_gpt2_token'):.1f}x Gen PPL ratio per GPT-2 token"),
    (DP, "Gen PPL of held-out text",
     lambda: f"Gen PPL under it is {judge('sanity', 'gen_ppl_data'):.2f} for held-out text"),
    (DP, "Gen PPL of the diffusion rows, ADLM's and the ablation's",
     lambda: (lambda d, a, n: f"{span(min(d), max(d), '.0f')} for the diffusion rows other than ADLM, "
                              f"{span(min(a), max(a), '.0f')} for ADLM and {span(min(n), max(n), '.0f')} for")(
         [table2(r, b, "gen_ppl") for r in DIFFUSION_ROWS for b in BUDGETS],
         [table2("adlm", b, "gen_ppl") for b in BUDGETS],
         [table2("tadm_nofusion", b, "gen_ppl") for b in BUDGETS])),
    (DP, "MAUVE: TADM† and TADM‡ against ReMDM",
     lambda: f"TADM† vs ReMDM ({plus(claim('mauve_tadm_gamma0_vs_remdm')['value'], 3)} ± "
             f"{claim('mauve_tadm_gamma0_vs_remdm')['se']:.3f}) and TADM‡ vs ReMDM "
             f"({plus(claim('mauve_tadm_vs_remdm')['value'], 3)} ± {claim('mauve_tadm_vs_remdm')['se']:.3f}) are "
             + verdict_of("mauve_tadm_gamma0_vs_remdm", "mauve_tadm_vs_remdm")),
    (DP, "the MAUVE comparisons' detectable margins",
     lambda: f"(its MDEs are {claim('mauve_tadm_gamma0_vs_remdm')['mde']:.2f} and {claim('mauve_tadm_vs_remdm')['mde']:.2f})"),
    (DP, "TADM‡ against TADM†",
     lambda: f"(MAUVE {signed(claim('gamma_mauve')['value'], 3)} ± {claim('gamma_mauve')['se']:.3f}, Gen PPL "
             f"{pct_change(claim('gamma_gen_ppl')['value'])}): " + verdict_of("gamma_mauve", "gamma_gen_ppl")),
    (DP, "TADM‡ against ReMDM in Gen PPL",
     lambda: f"({table2('tadm', 'T128', 'gen_ppl'):.1f} vs {table2('remdm', 'T128', 'gen_ppl'):.1f})"),
    (DP, "TADM's throughput against ADLM (a timing: moves with every run)",
     lambda: f"TADM‡ runs {1 + claim('throughput_vs_adlm')['value']:.2f}x ± {claim('throughput_vs_adlm')['se']:.2f}x "
             f"ADLM at T = 64, K = 8; the paper's \"up to 1.73x\" lies in the interval "
             f"({claim('throughput_vs_adlm')['verdict']})"),
    (DP, "TADM‡ against MDLM in the throughput stage (a timing)",
     lambda: "TADM‡ is {}x ± {}x MDLM there against {:.3f}x the layer calls".format(
         *md_cell("paper_figures/table2_throughput.md", "TADM‡ (γ=3e-3)", "vs MDLM", "T = 64").split(" (")[0].split(" ± "),
         table2("tadm", "T64", "layer_calls") / table2("mdlm", "T64", "layer_calls"))),
    (DP, "TADM:Post-train's speed-up over its base (a timing)",
     lambda: f"TADM:Post-train: {1 + claim('posttrain_throughput')['value']:.2f}x ± "
             f"{claim('posttrain_throughput')['se']:.2f}x over its base at K = 3 "
             f"({claim('posttrain_throughput')['verdict']}"),
    (DP, "TADM:Post-train's accuracy against the control",
     lambda: f"accuracy {signed(claim('posttrain_accuracy_vs_control')['value'])} ± "
             f"{claim('posttrain_accuracy_vs_control')['se']:.1f} points against the fresh-anchor control on "
             f"{claim('posttrain_accuracy_vs_control')['n']:.0f} problems: {claim('posttrain_accuracy_vs_control')['verdict']}"),
    (DP, "the post-train comparison's detectable margin",
     lambda: f"the run's detectable margin is {claim('posttrain_accuracy_vs_control')['mde']:.1f} points"),
    (DP, "the fusion's ablation in Table 2",
     lambda: f"collapses: MAUVE {table2('tadm_nofusion', 'T64', 'mauve'):.3f}, Gen PPL "
             f"{table2('tadm_nofusion', 'T64', 'gen_ppl'):.0f} at T = 64"),
    (DP, "how much of the staleness the fusion closes",
     lambda: "the fusion closes {:.3f} of the staleness KL of re-serving the stale prediction (the finding); against "
             "the fusion bypassed, {:.3f}".format(
                 claim("fusion_recovery")["value"],
                 statistics.fmean(r["recovery"] for r in map(staleness, range(1, 9))))),

    # docs/default-profile.md: TADM:Post-train against training-free caches (Table 1)
    (DP, "naive reuse's share of TADM's completions",
     lambda: f"completion on {100 * table1('NaivereuseK2_same_output_as_tadm'):.0f} % (K = 2) and "
             f"{100 * table1('NaivereuseK3_same_output_as_tadm'):.0f} % (K = 3) of the example-seeds"),
    (DP, "naive reuse's accuracy against TADM",
     lambda: f"scores {against_tadm('Naive reuse')} points against TADM"),
    (DP, "the outputs the trained fusion changes",
     lambda: f"changes {100 - 100 * table1('NaivereuseK2_same_output_as_tadm'):.0f} % (K = 2) and "
             f"{100 - 100 * table1('NaivereuseK3_same_output_as_tadm'):.0f} % (K = 3) of the outputs"),
    (DP, "the feature cache's accuracy against TADM",
     lambda: f"feature cache scores {against_tadm('Feature cache', plus)} points against TADM"),
    (DP, "the feature cache's measured speed (a timing)",
     lambda: f"runs only {table1('FeaturecacheK2_throughput_x'):.2f}x and {table1('FeaturecacheK3_throughput_x'):.2f}x "
             f"the base's speed (TADM {table1('TADMK2_throughput_x'):.2f}x and {table1('TADMK3_throughput_x'):.2f}x)"),
    (DP, "the feature cache's measured speed over its FLOP bound",
     lambda: f"(measured over FLOP bound {table1('FeaturecacheK2_measured_over_bound'):.2f} and "
             f"{table1('FeaturecacheK3_measured_over_bound'):.2f})"),
    (DP, "TADM against each training-free cache",
     lambda: f"{signed(claim('fusion_vs_naive')['value'])} ± {claim('fusion_vs_naive')['se']:.1f} points at K = 3 "
             f"against naive reuse and {signed(claim('fusion_vs_feature')['value'])} ± "
             f"{claim('fusion_vs_feature')['se']:.1f} against the feature cache (the run's detectable margins are "
             f"{claim('fusion_vs_naive')['mde']:.1f} and {claim('fusion_vs_feature')['mde']:.1f} points)"),
    (DP, "the speed of each Table 1 family (timings)",
     lambda: (lambda fast, slow: f"TADM and naive reuse run {span(min(fast), max(fast))}x the base, "
                                 f"the feature cache {span(min(slow), max(slow))}x")(
         [table1(f"{m}K{k}_throughput_x") for m in ("TADM", "Naivereuse") for k in (2, 3)],
         [table1(f"FeaturecacheK{k}_throughput_x") for k in (2, 3)])),
    (DP, "Table 1's FLOP bound at K = 3",
     lambda: f"The K = 3 bound is {table1_row('TADM K=3')['flop_bound_x']:.2f}x here"),

    # docs/default-profile.md: anchor staleness and the refresh sweep
    (DP, "the staleness trajectories",
     lambda: f"(`paper_figures/anchor_staleness.md`, {claim('staleness_growth')['n']:.0f} trajectories"),
    (DP, "the anchor's drift with cache age",
     lambda: f"as KL {staleness(1)['kl_reused']:.2e} nats/token at cache age 1 and {staleness(8)['kl_reused']:.2e} "
             f"at age 8: {staleness(8)['growth_reused']:.1f}x ± {staleness(8)['growth_reused_se']:.1f}x (after the "
             f"fusion {staleness(1)['kl_fused']:.2e} → {staleness(8)['kl_fused']:.2e})"),
    (DP, "the refresh sweep",
     lambda: f"Gen PPL {sweep('K=1')['gen_ppl']:.1f} at K = 1 and {sweep('K=8')['gen_ppl']:.1f} at K = 8 "
             f"({pct_change(claim('refresh_tradeoff')['value'])} ± {100 * claim('refresh_tradeoff')['se']:.1f} %), "
             f"MAUVE {sweep('K=1')['mauve']:.3f} → {sweep('K=8')['mauve']:.3f}, compute "
             f"{sweep('K=8')['compute_vs_k1']:.3f}x"),

    # docs/default-profile.md: where the minutes go
    (DP, "the run's stage time",
     lambda: f"**{stage_minutes():.1f} minutes** in all"),
    (DP, "the run's day, probe and memory",
     lambda: f"({run_date()}, speed probe median {source('metrics/stage_times.json')['probe_gflops_median']:.1f} "
             f"GFLOP/s), peak RSS {source('metrics/stage_times.json')['max_peak_rss_mib'] / 1024:.2f} GiB per process"),
    (DP, "the train and table1 stages' times",
     lambda: f"the `train` stage {stage_minutes('train'):.1f} minutes, `table1` {stage_minutes('table1'):.1f} "
             f"({stage_seconds('table1'):.0f} s"),
    (DP, "the probe over the run",
     lambda: "Over this run it read {} GFLOP/s, median {:.1f}".format(
         span(*source("metrics/stage_times.json")["probe_gflops_range"], fmt=".1f"),
         source("metrics/stage_times.json")["probe_gflops_median"])),
    (DP, "the train stage's job pool: order, seconds, split",
     lambda: "in the order {}; the longest job was the evaluator ({:.0f} s), the fusions took {:.0f} s and {:.0f} s, "
             "and the stage {:.0f} s for {:.0f} s of job time on two threads (a perfect split: {:.0f} s)".format(
                 ", ".join(jobs("order")), jobs("seconds")["evaluator"], jobs("seconds")["dg_posttrain"],
                 jobs("seconds")["dg_posttrain_fresh"], stage_seconds("train"), sum(jobs("seconds").values()),
                 sum(jobs("seconds").values()) / jobs("jobs"))),
    (DP, "one thread against two (the threads benchmark)",
     lambda: (lambda r: f"a second thread makes the MDLM training step {1 / r['MDLM train step']:.2f}x faster, the "
                        f"post-train base's {1 / r['DG base train step']:.2f}x, its no-grad forward "
                        f"{1 / r['DG forward (no grad)']:.2f}x, and the compute column's tiny paper-depth models slower "
                        f"(1 thread is {r['compute column (T = 128)']:.2f}x faster there)")(
         {row["workload"]: row.get("ratio") for row in source("benchmarks/results/threads.json")["rows"]})),
    (DP, "two training runs side by side (the threads benchmark)",
     lambda: (lambda pair: "finish {:.2f}x sooner side by side, one thread each, than one after the other on two "
                           "({} over {} rounds, start-up included)".format(
                               pair["speedup_median"],
                               span(min(r["serial"] / r["side by side"] for r in pair["rounds"]),
                                    max(r["serial"] / r["side by side"] for r in pair["rounds"])) + "x",
                               len(pair["rounds"])))(
         next(r for r in source("benchmarks/results/threads.json")["rows"] if r["workload"] == "pair"))),
    (DP, "the compute column on one thread (the threads benchmark)",
     lambda: "run on one thread ({:.2f}x faster there)".format(
         next(r["ratio"] for r in source("benchmarks/results/threads.json")["rows"]
              if r["workload"] == "compute column (T = 128)"))),
    (DP, "bf16 sampling against fp32 (the precision benchmark)",
     lambda: (lambda m, t: f"MDLM samples {statistics.median(m['speedup']):.2f}x faster, TADM at K = 8 "
                           f"{statistics.median(t['speedup']):.2f}x, and bf16 moves the network's prediction by a KL of "
                           f"{m['kl_fp32_bf16']:.1e} / {t['kl_fp32_bf16']:.1e} nats per masked position")(
         *source("benchmarks/results/precision_throughput.json")["rows"])),
    (DP, "papermill's start against tadm.papermill_cli (the papermill_start benchmark)",
     lambda: (lambda p: "{} s against {} s for a one-cell notebook, kernel start included, {}x ({}x over {} "
                        "alternated rounds".format(
                            md_cell(p, "`papermill`", "median"), md_cell(p, "`tadm.papermill_cli`", "median"),
                            *re.search(r"median ([\d.]+)x \[([\d.]+–[\d.]+)\] over", read_text(p)).groups(),
                            re.search(r"(\d+) rounds", read_text(p)).group(1)))(
         _note("benchmarks/results/papermill_start.md"))),
    (DP, "the ASRD stage's time",
     lambda: f"a smaller ASRD comparison ({stage_minutes('asrd'):.1f} minutes"),
    (DP, "the judge's check against shuffled text",
     lambda: f"this run: {judge('sanity', 'shuffled_ppl_ratio_per_gpt2_token'):.3f}× per GPT-2 token"),
    (DP, "the judge's size and training (the choices table)",
     lambda: f"a GPT-2 (d = {params('eval', 'trained', 'd_model')}, {params('eval', 'trained', 'n_layers')} layers, "
             f"{judge('steps')} steps)"),

    # docs/pipeline.md
    ("docs/pipeline.md", "the judge's tokens against GPT-2's",
     lambda: f"the ratio per the judge's own, {judge('sanity', 'judge_tokens') / judge('sanity', 'gpt2_tokens'):.1f}× "
             "finer, tokens"),

    # docs/deviations.md
    ("docs/deviations.md", "β2 = 0.95's gain over 0.999 (the β2 benchmark)",
     lambda: (lambda g: f"0.95 ends every model {span(min(g), max(g))} nats lower")(
         [num(md_cell(LR, m, "gain")) for m in (("MDLM", "0"), ("SEDD", "0"), ("TADM†", "0"), ("ADLM", "0"),
                                                 ("ADLM", "1"))])),
    ("docs/deviations.md", "the antithetic sampler's variance (the antithetic_variance benchmark)",
     lambda: (lambda r: "the per-batch loss's variance is {:.2f} ± {:.2f} (bootstrap se; 95 % interval {}) times the "
                        "release's sampler's (against iid times: {:.2f} ± {:.2f} here, {:.2f} ± {:.2f} the "
                        "release's)".format(
                            r["shared/stratum"]["ratio"], r["shared/stratum"]["se"],
                            span(*r["shared/stratum"]["ci95"]), r["shared/iid"]["ratio"], r["shared/iid"]["se"],
                            r["stratum/iid"]["ratio"], r["stratum/iid"]["se"]))(
         source("benchmarks/results/antithetic_variance.json")["ratios"]["within"])),
    ("docs/deviations.md", "the judge's size and training",
     lambda: f"a {params('eval', 'trained', 'n_layers')}-layer GPT-2 trained {judge('steps')} steps"),

    # docs/gpus.md
    ("docs/gpus.md", "TADM's measured speed-up over its FLOP bound (the sample_throughput benchmark)",
     lambda: (lambda t: "{} at K = 1 / 2 / 4 / 8 (medians of {} rounds, per-round range {}; against MDLM {})".format(
         " / ".join(f"{r['measured_over_bound_vs_adlm']['median']:.2f}" for r in t),
         len(next(iter(t))["seconds"]),
         span(min(r["measured_over_bound_vs_adlm"]["min"] for r in t),
              max(r["measured_over_bound_vs_adlm"]["max"] for r in t), dash="-"),
         span(min(r["measured_over_bound_vs_mdlm"]["median"] for r in t),
              max(r["measured_over_bound_vs_mdlm"]["median"] for r in t), dash="-")))(
         [r for r in source("benchmarks/results/sample_throughput_paper.json")["rows"]
          if r["method"].startswith("tadm K=")])),
    ("docs/gpus.md", "what a step spends outside the network at K = 4 (the sample_step_profile benchmark)",
     lambda: "the head ({:.0f} % of a step) and the nucleus draw of random weights' flat rows ({:.0f} %;".format(
         num(md_cell("benchmarks/results/sample_step_profile.md", "head", 4, "tadm K=4")),
         num(md_cell("benchmarks/results/sample_step_profile.md", "nucleus", 4, "tadm K=4")))),
]


def _excerpt(doc: str, want: str) -> str:
    """What the document says where the quote's words before its first figure are (of their
    occurrences, the one most like the quote), if it has them."""
    lead = re.split(r"[-+−]?\d", want, maxsplit=1)[0]
    body = text(doc)
    if len(lead) < 12:
        return ""
    found = [body[m.start():m.start() + len(want) + 20] for m in re.finditer(re.escape(lead), body)]
    if not found:
        return ""
    best = max(found, key=lambda s: difflib.SequenceMatcher(None, s[:len(want)], want).ratio())
    return f"\n  {doc} says instead: {best!r}"


@pytest.mark.parametrize("doc, what, quote", FIGURES, ids=[f"{d}: {w}" for d, w, _ in FIGURES])
def test_a_quoted_figure_equals_the_committed_run(doc, what, quote):
    _read.clear()
    want = quote()
    sources = ", ".join(f"{p} ({where(p)})" for p in dict.fromkeys(_read))
    if want not in text(doc):
        pytest.fail(f"{doc} ({where(doc)}) should quote {what} as\n  {want!r}\n  (formatted from {sources}; "
                    f"update the prose to the committed files and commit the two together){_excerpt(doc, want)}",
                    pytrace=False)
