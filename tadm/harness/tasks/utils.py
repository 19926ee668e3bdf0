"""The harness's hooks for tadm_arithmetic.yaml: the arithmetic rows of the SFT validation
split and Table 1's answer extraction (tadm.data.arithmetic)."""

from tadm.data.arithmetic import extract_answer

INVALID = "[invalid]"  # a completion with no number in it (never a reference)


def arithmetic_rows(dataset):
    """The rows of the SFT mixture that are arithmetic problems, in file order."""
    return dataset.filter(lambda row: row["source"] == "arithmetic")


def reference(doc: dict) -> str:
    """The canonical form of the problem's answer."""
    return extract_answer(str(doc["answer"]))


def extract_answers(resps, docs):
    """Each completion's canonical answer (INVALID when it holds no number)."""
    return [[extract_answer(r) or INVALID for r in rs] for rs in resps]
