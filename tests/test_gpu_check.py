"""benchmarks/gpu_check.py runs on a GPU only when a session is lent one; its --smoke mode runs
every section at micro sizes on the CPU here so that it cannot rot in between."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_smoke_runs_every_section(tmp_path):
    # (b), kill and resume, is covered on the CPU by tests/train; it takes three processes here
    out = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke", "--sections", "acde",
                          "--device", "cpu", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_check_smoke.json").read_text())["rows"]
    sections = {r["section"].split()[0] for r in rows if r["check"] != "FAILED"}
    assert {"a", "c", "d", "e"} <= sections
    assert not [r for r in rows if r["check"] == "FAILED"]
    # the sampling rows carry measured / FLOP-bound ratios for every method and K
    sampled = [r["check"] for r in rows if r["section"] == "c sample"]
    for label in ("mdlm", "adlm", "tadm K=1", "tadm K=2", "tadm K=4", "tadm K=8"):
        assert any(c.startswith(label + " batch 1") for c in sampled), label
