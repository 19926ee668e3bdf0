"""The dry run's overlay changes sizes only: every other key is the paper profile's."""

import re

import yaml

from tadm import config
from tadm.dryrun import run

# the last key of every leaf the overlay may change: dimensions, steps, counts, batch sizes,
# and runtime.nproc (2 processes through torchrun, gloo, where the paper profile runs several)
SIZE_KEY = re.compile(r"^(d_model|n_heads|\w*_layers|fusion_rank|seq_len|shard_sequences|canvas_length|block_size|"
                      r"max_\w*tokens|max_context_tokens|\w*_tokens|steps|\w*_steps|\w*_every|num_samples|"
                      r"\w*_samples|\w*_examples|\w*_canvases|\w*_eval|eval_sequences|validation_docs|max_docs|count|"
                      r"global_batch|micro_batch|batch_size|\w*_batch|\w*_batch_size|bootstrap|\w*_rounds|"
                      r"\w*block_size|nproc|T)$")  # T: a sampling budget's reverse steps


def leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (str(k),))
    elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        for i, v in enumerate(node):
            yield from leaves(v, path + (f"[{i}]",))
    else:
        yield path, node


def test_overlay_changes_only_sizes_and_renders_valid():
    paper, dry = dict(leaves(config.merged_profile("paper"))), dict(leaves(run.render()))
    assert paper.keys() == dry.keys()
    changed = [p for p in paper if paper[p] != dry[p]]
    assert changed, "the overlay shrinks nothing"
    not_sizes = [".".join(p) for p in changed if not SIZE_KEY.match(p[-1])]
    assert not not_sizes, f"the dry-run overlay changes non-size keys: {not_sizes}"
    # the paper's hub inputs stay hub inputs
    p = config.from_dict(run.render(), source="dry run")
    assert p.corpus.source == "openwebtext" and p.sft.source == "hub" and p.tokenizer.kind == "gpt2"
    assert p.posttrain.base_model == "google/diffusiongemma-26B-A4B-it" and p.eval.featurizer == "gpt2-large"
    assert p.runtime.nproc == 2 and p.runtime.compile and p.runtime.precision == "bf16"


def test_overlay_is_not_a_profile_of_its_own():
    # profiles/dry-run/ is not globbed as a profile (`make profile` renders over default.yaml)
    assert "paper" in config.available_profiles() and not any("dry" in n for n in config.available_profiles())
    assert yaml.safe_load(run.OVERLAY.read_text())["runtime"] == {"nproc": 2}
