"""The harness's hooks for this folder's tasks: tadm_arithmetic.yaml (the arithmetic rows of the
SFT validation split and Table 1's answer extraction, tadm.data.arithmetic) and the Tiny
Shakespeare tasks (tadm_shakespeare.yaml's per-word and per-byte counts, the cloze questions of
tadm_shakespeare_cloze.yaml)."""

import random
import re

from tadm.data.arithmetic import extract_answer

INVALID = "[invalid]"  # a completion with no number in it (never a reference)

CLOZE_CONTEXT = 100  # characters of passage before the gap (about; it ends where a word starts)
CLOZE_CONTINUATION = 40  # characters of every continuation
CLOZE_CHOICES = 4  # the true continuation and three distractors
CLOZE_PER_DOC = 5  # questions per document
CLOZE_SEED = 58  # fixes the questions: the same on every run and machine


def arithmetic_rows(dataset):
    """The rows of the SFT mixture that are arithmetic problems, in file order."""
    return dataset.filter(lambda row: row["source"] == "arithmetic")


def reference(doc: dict) -> str:
    """The canonical form of the problem's answer."""
    return extract_answer(str(doc["answer"]))


def extract_answers(resps, docs):
    """Each completion's canonical answer (INVALID when it holds no number)."""
    return [[extract_answer(r) or INVALID for r in rs] for rs in resps]


def perplexity_results(doc, results):
    """A document's log-likelihood with its word and byte counts (the harness's weighted
    perplexity metrics), counted on the text as stored."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["text"]))
    size = len(doc["text"].encode("utf-8"))
    return {"word_perplexity": (loglikelihood, words), "byte_perplexity": (loglikelihood, size),
            "bits_per_byte": (loglikelihood, size)}


def _word_starts(text: str, lo: int, hi: int) -> list[int]:
    """Positions in [lo, hi) where a word starts (a non-space after a space)."""
    return [i for i in range(max(lo, 1), hi) if text[i - 1].isspace() and not text[i].isspace()]


def cloze_questions(texts: list[str], seed: int = CLOZE_SEED) -> list[dict]:
    """CLOZE_PER_DOC questions per text (long enough): {context, choices, gold}; distractors are
    CLOZE_CONTINUATION characters from a word start of another text; the choices' order is
    drawn. Deterministic in `texts` and `seed`."""
    rng = random.Random(seed)
    span = CLOZE_CONTEXT + CLOZE_CONTINUATION
    usable = [i for i, t in enumerate(texts) if len(t) > 2 * span]
    rows = []
    for i in usable:
        text = texts[i]
        starts = _word_starts(text, CLOZE_CONTEXT, len(text) - CLOZE_CONTINUATION)
        for gap in sorted(rng.sample(starts, min(CLOZE_PER_DOC, len(starts)))):
            context = text[gap - CLOZE_CONTEXT:gap]
            truth = text[gap:gap + CLOZE_CONTINUATION]
            others = [j for j in usable if j != i] or [i]
            choices = [truth]
            while len(choices) < CLOZE_CHOICES:
                other = texts[rng.choice(others)]
                at = rng.choice(_word_starts(other, 0, len(other) - CLOZE_CONTINUATION))
                candidate = other[at:at + CLOZE_CONTINUATION]
                if candidate not in choices:
                    choices.append(candidate)
            rng.shuffle(choices)
            rows.append({"context": context, "choices": choices, "gold": choices.index(truth)})
    return rows


def cloze_rows(dataset):
    """tadm_shakespeare_cloze's questions from a split of the corpus (`cloze_questions`)."""
    import datasets  # lazy: datasets takes ~0.9 s to import; lm-eval loads this file for every task of ours

    return datasets.Dataset.from_list(cloze_questions(list(dataset["text"])))
