"""The staleness notebook's growth note states, with the run's numbers, whether the stale-vs-fresh
KL grows by the target between cache age 1 and the oldest age, and why not when it does not."""

import numpy as np
import pandas as pd

from tadm.experiments.staleness import growth_note


def _summary(fused_power: float) -> pd.DataFrame:
    age = np.arange(0, 9, dtype=float)
    reused = 0.02 * age  # linear in the age: at most 8x from age 1 to 8
    fused = 0.003 * age ** fused_power
    return pd.DataFrame({"kl_fused": fused, "kl_fused_se": 0.1 * fused + 1e-6, "kl_reused": reused,
                         "recovery": np.where(age > 0, 1 - fused / np.maximum(reused, 1e-12), np.nan)},
                        index=pd.Index(age.astype(int), name="age"))


def test_a_linear_reuse_kl_cannot_grow_tenfold_and_the_note_says_why():
    note = growth_note(_summary(0.35))
    assert f"grows {8 ** 0.35:.1f}x" in note and "reused, unfused anchor 8.0x" in note
    assert "Not met" in note and "age^1.00" in note and "at least 1.11" in note  # log 10 / log 8


def test_growth_past_the_target_is_met():
    note = growth_note(_summary(1.2))
    assert f"grows {8 ** 1.2:.1f}x" in note and note.endswith("The target is met.") and "Not met" not in note
