"""Atomic writes into an output directory that cannot be made or written end in one line naming
it (`python -m tadm pack --out` somewhere unwritable included)."""

import os

import pytest

from tadm.config import PackingConfig
from tadm.data import packing
from tadm.data.tokenizer import build_gpt2
from tadm.errors import DataError
from tadm.io import atomic_write_text, write_jsonl, write_manifest


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message, message
    return message


@pytest.mark.parametrize("where", ["under-a-file", "proc", "read-only"])
def test_an_unwritable_output_directory_is_one_line(tmp_path, where):
    if where == "under-a-file":
        (tmp_path / "afile").write_text("")
        out, reason = tmp_path / "afile" / "sub", "Not a directory"
    elif where == "proc":
        out, reason = "/proc/x", "No such file or directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        (tmp_path / "ro").mkdir(mode=0o555)
        out, reason = tmp_path / "ro", "Permission denied"
    with pytest.raises(DataError) as e:
        atomic_write_text(f"{out}/result.json", "{}")
    assert _one_line(e) == f"{out}: cannot write result.json there ({reason}); choose a writable output directory"


def test_pack_into_an_unwritable_out_is_one_line(tmp_path):
    """The pack stage's writer (packing.build, behind `python -m tadm pack --out`)."""
    write_jsonl(tmp_path / "corpus" / "train.jsonl", ({"text": f"document {i} " * 20} for i in range(8)))
    write_jsonl(tmp_path / "corpus" / "validation.jsonl", ({"text": f"held out {i} " * 20} for i in range(2)))
    write_manifest(tmp_path / "corpus", "corpus", {})
    (tmp_path / "afile").write_text("")
    with pytest.raises(DataError) as e:
        packing.build(PackingConfig(seq_len=16, shard_sequences=10), tmp_path / "corpus", build_gpt2(), tmp_path / "afile")
    assert _one_line(e).startswith(f"{tmp_path / 'afile'}: cannot write ")
