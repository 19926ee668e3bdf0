"""Table 1's speed across invocations (tadm.experiments.table1_speed; the blocks timed by
tadm.experiments.table1.time_block): timing-only blocks, each its own process with its own prompt
batches and sampling seed, combined with the scored pass on the log scale; a block timed with other
settings is refused in one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tadm import config
from tadm.errors import DataError
from tadm.experiments import table1, table1_speed
from tadm.metrics.invocations import combine
from tests.experiments.conftest import posttrain_raw


def test_speed_starts_spread_the_blocks_over_the_full_batches():
    # 10 full batches of 4 (40 examples), 2 per block: block 1 from the first, the last block ending at the last
    assert [table1_speed.speed_starts(42, 4, b, 4, 2) for b in (1, 2, 3)] == [[0, 4], [16, 20], [32, 36]]
    assert table1_speed.speed_starts(42, 4, 1, 2, 2) == [0, 4]
    assert table1_speed.speed_starts(8, 16, 1, 3, 2) == [0]  # no full batch: the first (short) one
    assert table1_speed.speed_starts(8, 3, 2, 3, 5) == [0, 3]  # more asked than there are: every full batch


def test_timing_blocks_in_their_own_processes_combine_with_the_scored_pass(posttrain_workspace, tmp_path):
    raw = posttrain_raw(**{"timing.table1_blocks": 3, "timing.table1_batches": 1, "posttrain.cache_methods": [],
                           "posttrain.refresh_every": [2]})
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps(raw))
    p = config.load(params)
    blocks = tmp_path / "speed"
    for b in (1, 2):  # each block its own process, as the pipeline runs them
        proc = subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "table1-speed", "--block", str(b),
                               "--root", str(posttrain_workspace), "--sft", str(posttrain_workspace / "data" / "sft"),
                               "--out", str(table1_speed.speed_block_path(b, blocks))], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    timed = [json.loads(table1_speed.speed_block_path(b, blocks).read_text()) for b in (1, 2)]
    labels = ["Base", table1.CONTROL, "TADM K=2"]
    for b, block in zip((1, 2), timed):
        assert block["block"] == b and block["seed"] == table1_speed.SPEED_SEED + b and block["methods"] == labels
        r = block["results"]["arithmetic"]
        assert r["batches"] == table1_speed.speed_starts(8, 3, b, 3, 1) and len(r["methods"]["Base"]["seconds"]) == 1
        assert r["methods"]["Base"]["throughput_x"] == 1.0
    assert timed[0]["results"]["arithmetic"]["batches"] != timed[1]["results"]["arithmetic"]["batches"]

    results = table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                         out=tmp_path / "t1.json", log=lambda *_: None, speed_dir=blocks)
    rows = results["tasks"]["arithmetic"]["methods"]
    for label in labels:
        row = rows[label]
        per = [row["throughput_x_scored"]] + [b["results"]["arithmetic"]["methods"][label]["throughput_x"] for b in timed]
        assert row["throughput_x"] == pytest.approx(math.exp(np.mean(np.log(per))))
        assert row["throughput_df"] == 2 and row["speed_blocks"]["blocks"] == per
        assert row["throughput_se"] == pytest.approx(combine(per)["se"])
    assert rows["Base"]["throughput_x"] == 1.0 and rows["Base"]["throughput_se"] == 0.0

    # a block timed with other settings, or one missing: one line naming the file
    other = config.from_dict({**raw, "posttrain": {**raw["posttrain"], "refresh_every": [3]}})
    with pytest.raises(DataError, match=r"block_1.json was timed with methods .*rerun `dvc repro table1_speed`") as e:
        table1.run(other, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                   out=tmp_path / "t2.json", log=lambda *_: None, speed_dir=blocks)
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"block_1.json is missing: .*table1-speed --block 1"):
        table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                   out=tmp_path / "t3.json", log=lambda *_: None, speed_dir=tmp_path / "nowhere")
    with pytest.raises(DataError, match="block 0 is not a timing-only block of timing.table1_blocks=3"):
        table1.time_block(p, 0, root=posttrain_workspace)
