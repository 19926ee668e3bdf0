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


def stage_minutes(name: str | None = None) -> float:
    """Minutes of one stage (None: all of them) of the committed run."""
    times = source("metrics/stage_times.json")
    return (times["total_seconds"] if name is None else times["stages"][name]["seconds"]) / 60


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
    ("README.md", "the run's stage time",
     lambda: f"| `make reproduce` (default profile, every stage from scratch) | {stage_minutes():.1f} minutes"),
]


@pytest.mark.parametrize("doc, what, quote", FIGURES, ids=[f"{d}: {w}" for d, w, _ in FIGURES])
def test_a_quoted_figure_equals_the_committed_run(doc, what, quote):
    want = quote()
    assert want in text(doc), f"{doc} should quote {what} as {want!r} (the committed run's value)"
