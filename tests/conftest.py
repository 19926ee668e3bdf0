"""Shared test set-up: the default profile is offline; nothing may reach a hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under xdist (`make test`: 2 workers on 2 cores) each worker, and every process it starts (the
# micro pipeline's stages, the two-process tests), gets cores // workers intra-op threads, as the
# train stage's jobs do (tadm.runtime.run_jobs): two workers' OpenMP teams of two threads on two
# cores spin-wait on each other (the micro pipeline's repro took 391 s alone and 709 s beside the
# other worker at two threads each).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])


import copy  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402


def torch_single_thread():
    """Run torch single-threaded for the duration of a fixture (tiny ops on 2 shared cores:
    OpenMP threads only wait on each other). Sub-packages make it an autouse fixture."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def save_tiny_gpt2(path, positions: int):
    """A randomly initialised 2-layer GPT-2 with the real GPT-2 tokenizer, saved with
    save_pretrained into `path`: stands in for "gpt2-large" (same classes, same loading code)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from tadm.data.tokenizer import build_gpt2

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=positions, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=50256, eos_token_id=50256)
    GPT2LMHeadModel(cfg).save_pretrained(str(path))
    build_gpt2().save_pretrained(str(path))
    return path


def micro_raw(**overrides) -> dict:
    """The micro profile as a raw mapping, with `section.key` overrides."""
    from tadm import config

    raw = copy.deepcopy(config.render_profile("micro"))
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        raw[section][key] = value
    return raw


def forget_method(name: str) -> None:
    """Undo what defining a test's own method unit registered under `name`: its run name, its
    Table 2 row of that name and its model type (each only if there)."""
    from tadm.models import MODEL_REGISTRY
    from tadm.registry import METHODS, TABLE2_ROWS

    for registry in (METHODS, TABLE2_ROWS):
        if name in registry._units:
            registry.unregister(name)
    MODEL_REGISTRY.pop(name, None)


def write_params(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def build_micro_data(root: Path, shard_sequences: int | None = None) -> Path:
    """The micro profile's data stages (corpus -> BPE -> pack) under `root`; returns root/packed.
    `shard_sequences` overrides packing.shard_sequences (several small shards)."""
    from tadm import config
    from tadm.data import corpus, packing, tokenizer

    p = config.from_dict(micro_raw())
    corpus.build(p.corpus, root / "corpus")
    tokenizer.build(p.tokenizer, root / "corpus", root / "tokenizer")
    cfg = p.packing if shard_sequences is None else type(p.packing)(seq_len=p.packing.seq_len,
                                                                     shard_sequences=shard_sequences)
    packing.build(cfg, root / "corpus", tokenizer.load_tokenizer(root / "tokenizer"), root / "packed")
    return root / "packed"


@pytest.fixture(scope="session")
def micro_packed(tmp_path_factory) -> Path:
    """Packed token shards of the micro profile (corpus -> BPE -> pack), built once."""
    return build_micro_data(tmp_path_factory.mktemp("micro_data"))


def pytest_collection_modifyitems(config, items):
    """The micro pipeline's file first: under `--dist loadfile` a file runs whole on one worker,
    and the longest one (~12 min beside the other worker) started ~4 minutes in finishes alone.
    `make test` passes `--no-loadscope-reorder`, without which xdist would start the files with
    the most tests first whatever this order. Stable: every other test keeps its order."""
    items.sort(key=lambda item: item.path.name != "test_pipeline.py")
