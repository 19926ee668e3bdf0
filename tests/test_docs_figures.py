"""Figures the README and docs/ quote from the committed run equal the committed files they come
from (issue 34): each quoted figure is registered here with its source (a JSON file the pipeline
wrote and a key in it) and the format it is quoted in, and must appear in its document as
formatted from the source. A rerun that moves a number fails here until the prose is updated.

The README's results table is checked whole elsewhere (tests/test_readme_results.py)."""

import json
import re
from functools import lru_cache

import pytest

from tadm.config import ROOT

RUNS = ("mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar")


@lru_cache(maxsize=None)
def source(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def train(run: str, key: str) -> float:
    return source(f"metrics/train/{run}.json")[key]


def judge(*keys: str) -> float:
    value = source("metrics/evaluator.json")
    for k in keys:
        value = value[k]
    return value


def table1(key: str) -> float:
    """A figure of the committed Table 1 (metrics/table1.json; keys without the task prefix)."""
    return source("metrics/table1.json")[f"arithmetic_{key}"]


def stage_minutes(name: str | None = None) -> float:
    """Minutes of one stage (None: all of them) of the committed run."""
    times = source("metrics/stage_times.json")
    return (times["total_seconds"] if name is None else times["stages"][name]["seconds"]) / 60


def claim(cid: str) -> dict:
    """A row of the claims table the pipeline wrote (paper_figures/claims.csv), numbers as floats."""
    import csv

    with open(ROOT / "paper_figures" / "claims.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == cid)
    return {**row, **{k: float(row[k]) for k in ("value", "se", "n", "mde")}}


def signed(x: float, digits: int = 1) -> str:
    """x as the prose writes it: a typographic minus."""
    return f"{x:.{digits}f}".replace("-", "\u2212")


def text(doc: str) -> str:
    """The document with every run of whitespace as one space (quotes may wrap lines)."""
    return re.sub(r"\s+", " ", (ROOT / doc).read_text())


# (document, what is quoted, the quote as formatted from the committed sources)
FIGURES = [
    ("docs/default-profile.md", "nats below the unigram line, every run",
     lambda: "| nats below the unigram line after 1000 steps | "
             + " | ".join(f"{train(r, 'below_unigram'):.2f}" for r in RUNS) + " |"),
    ("docs/default-profile.md", "the unigram entropy of the validation tokens",
     lambda: f"unigram entropy of the validation tokens {train('mdlm', 'unigram_entropy'):.3f} nats/token"),
    ("docs/default-profile.md", "ADLM against the line",
     lambda: f"({train('adlm', 'below_unigram'):.4f} nats below: {train('adlm', 'val_nelbo'):.3f} against "
             f"{train('adlm', 'unigram_entropy'):.3f}"),
    ("docs/default-profile.md", "validation NELBOs on this machine",
     lambda: f"(MDLM {train('mdlm', 'val_nelbo'):.3f}, TADM† {train('tadm_gamma0', 'val_nelbo'):.3f}, "
             f"SEDD {train('sedd', 'val_nelbo'):.3f})"),
    ("docs/default-profile.md", "the judge's NLL against AR's",
     lambda: f"validation NLL {judge('val_nll'):.3f} nats/token on the AR model's own tokens against AR's "
             f"{train('ar', 'val_nelbo'):.3f}"),
    ("docs/default-profile.md", "the judge's checks",
     lambda: f"MAUVE {judge('sanity', 'mauve_data_shuffled'):.3f}, a "
             f"{judge('sanity', 'shuffled_ppl_ratio_per_gpt2_token'):.1f}x Gen PPL ratio per GPT-2 token"),
    ("docs/default-profile.md", "Gen PPL of held-out text",
     lambda: f"Gen PPL under it is {judge('sanity', 'gen_ppl_data'):.2f} for held-out text"),
    ("docs/default-profile.md", "the run's stage time",
     lambda: f"**{stage_minutes():.1f} minutes** in all"),
    ("docs/default-profile.md", "the ASRD stage's time",
     lambda: f"a smaller ASRD comparison ({stage_minutes('asrd'):.1f} minutes"),
    ("docs/default-profile.md", "TADM's throughput against ADLM (a timing: moves with every run)",
     lambda: f"TADM‡ runs {1 + claim('throughput_vs_adlm')['value']:.2f}x ± {claim('throughput_vs_adlm')['se']:.2f}x "
             "ADLM at T = 64, K = 8"),
    ("docs/default-profile.md", "TADM:Post-train's speed-up over its base (a timing)",
     lambda: f"TADM:Post-train: {1 + claim('posttrain_throughput')['value']:.2f}x ± "
             f"{claim('posttrain_throughput')['se']:.2f}x over its base at K = 3"),
    ("docs/default-profile.md", "TADM:Post-train's accuracy against the control",
     lambda: f"accuracy {signed(claim('posttrain_accuracy')['value'])} ± {claim('posttrain_accuracy')['se']:.1f} "
             f"points against the fresh-anchor control on {claim('posttrain_accuracy')['n']:.0f} problems"),
    ("docs/default-profile.md", "the post-train comparison's detectable margin",
     lambda: f"the run's detectable margin is {claim('posttrain_accuracy')['mde']:.1f} points"),
    ("docs/default-profile.md", "naive reuse's share of TADM's completions",
     lambda: f"completion on {100 * table1('NaivereuseK2_same_output_as_tadm'):.0f} % (K = 2) and "
             f"{100 * table1('NaivereuseK3_same_output_as_tadm'):.0f} % (K = 3) of the example-seeds"),
    ("docs/default-profile.md", "the feature cache's measured speed (a timing)",
     lambda: f"runs only {table1('FeaturecacheK2_throughput_x'):.2f}x and {table1('FeaturecacheK3_throughput_x'):.2f}x "
             "the base's speed"),
    ("docs/default-profile.md", "TADM against the best training-free cache",
     lambda: f"{signed(claim('fusion_vs_training_free')['value'])} ± {claim('fusion_vs_training_free')['se']:.1f} "
             f"points at K = 3 against the feature cache (the run's detectable margin is "
             f"{claim('fusion_vs_training_free')['mde']:.1f} points)"),
    ("README.md", "TADM against the best training-free cache",
     lambda: f"{signed(claim('fusion_vs_training_free')['value'])} ± {claim('fusion_vs_training_free')['se']:.1f} "
             "points (TADM's accuracy minus the feature cache's"),
    ("README.md", "the run's stage time",
     lambda: f"| `make reproduce` (default profile, every stage from scratch) | {stage_minutes():.1f} minutes"),
]


@pytest.mark.parametrize("doc, what, quote", FIGURES, ids=[f"{d}: {w}" for d, w, _ in FIGURES])
def test_a_quoted_figure_equals_the_committed_run(doc, what, quote):
    want = quote()
    assert want in text(doc), f"{doc} should quote {what} as {want!r} (the committed run's value)"
