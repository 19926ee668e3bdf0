"""Atomic writes into an output directory that cannot be made or written end in one line naming
it (`python -m tadm pack --out` somewhere unwritable included); an atomic write never removes what
its caller did not create (a file over a folder, a folder over a file or over a foreign folder:
refused in one line, all of it kept), and a stage still replaces its own previous output."""

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


# --------------------------------------------------------------------------- nothing the caller did not create is removed
# Before: atomic_path moved an existing folder at its path aside and deleted it (shutil.rmtree),
# whatever was written and whatever the folder held.


def _untouched(folder, text="keep me"):
    assert folder.is_dir() and (folder / "important.txt").read_text() == text
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]  # no temporary left


@pytest.fixture
def foreign(tmp_path):
    """A folder the writer did not make, holding a file of someone's."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "important.txt").write_text("keep me")
    return folder


def test_a_file_over_a_folder_is_refused_and_the_folder_kept(foreign):
    with pytest.raises(DataError) as e:
        atomic_write_text(foreign, "params")
    assert _one_line(e).startswith(f"{foreign} is an existing folder (holding important.txt), where a file is to be "
                                   "written: the file would replace it; refused")
    _untouched(foreign)


def test_a_folder_appearing_before_the_rename_is_not_replaced_by_a_file(tmp_path):
    """Checked again just before the rename, against what is there then."""
    from tadm.io import atomic_path

    path = tmp_path / "out.json"
    with pytest.raises(DataError) as e:
        with atomic_path(path) as tmp:
            tmp.write_text("{}")
            path.mkdir()
            (path / "important.txt").write_text("keep me")
    assert f"{path} is an existing folder (holding important.txt)" in _one_line(e)
    _untouched(path)


def test_a_folder_over_a_file_is_refused_and_the_file_kept(tmp_path):
    from tadm.io import atomic_path

    path = tmp_path / "notes"
    path.write_text("keep me")
    with pytest.raises(DataError) as e:  # declared: refused on entry, before the work
        with atomic_path(path, "dir") as tmp:
            raise AssertionError("the work ran")
    assert _one_line(e).startswith(f"{path} is an existing file, where a folder is to be written; refused")
    with pytest.raises(DataError) as e:  # undeclared: refused before the rename, against what was made
        with atomic_path(path) as tmp:
            tmp.mkdir()
    assert _one_line(e).startswith(f"{path} is an existing file, where a folder is to be written; refused")
    assert path.read_text() == "keep me"


def test_a_folder_over_a_foreign_folder_is_refused(foreign):
    from tadm.io import atomic_path

    with pytest.raises(DataError) as e:
        with atomic_path(foreign, "dir", ours=("shard_*.npy",)) as tmp:
            raise AssertionError("the work ran")
    assert _one_line(e).startswith(f"{foreign} is an existing folder holding important.txt, which this output does "
                                   "not write: replacing the folder would delete them; refused")
    _untouched(foreign)
    with pytest.raises(DataError):  # a folder that changed between the entry and the rename
        with atomic_path(foreign.parent / "new", "dir", ours=("shard_*.npy",)) as tmp:
            tmp.mkdir()
            (foreign.parent / "new").mkdir()
            (foreign.parent / "new" / "important.txt").write_text("keep me")
    _untouched(foreign.parent / "new")


def test_pack_shards_over_a_foreign_folder_are_refused(foreign):
    import numpy as np

    with pytest.raises(DataError) as e:
        packing.write_shards(iter(np.zeros((4, 8), dtype=np.int64)), foreign, 8, 2, np.dtype(np.uint16))
    assert f"{foreign} is an existing folder holding important.txt" in _one_line(e)
    _untouched(foreign)


def test_a_folder_replaces_its_own_previous_output(tmp_path):
    """A rerun of a stage: the pack stage's shards (fewer this time), the tokenizer's folder with
    its manifest, an empty folder."""
    import numpy as np

    from tadm.config import TokenizerConfig
    from tadm.data import tokenizer
    from tadm.io import atomic_path

    out = tmp_path / "train"
    packing.write_shards(iter(np.zeros((6, 8), dtype=np.int64)), out, 8, 2, np.dtype(np.uint16))
    assert sorted(p.name for p in out.iterdir()) == ["shard_00000.npy", "shard_00001.npy", "shard_00002.npy"]
    packing.write_shards(iter(np.ones((2, 8), dtype=np.int64)), out, 8, 2, np.dtype(np.uint16))
    assert sorted(p.name for p in out.iterdir()) == ["shard_00000.npy"]
    assert np.load(out / "shard_00000.npy").tolist() == [[1] * 8] * 2

    tok_dir = tmp_path / "tokenizer"
    for _ in range(2):
        m = tokenizer.build(TokenizerConfig(kind="gpt2"), tmp_path / "no-corpus", tok_dir)
    assert m["counts"]["vocab_size"] == len(tokenizer.load_tokenizer(tok_dir))
    assert (tok_dir / "manifest.json").is_file()

    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with atomic_path(tmp_path / "empty", "dir") as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("new")
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["a.txt"]


def test_a_tokenizer_folder_holding_another_file_is_refused(foreign):
    from tadm.config import TokenizerConfig
    from tadm.data import tokenizer

    (foreign / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError) as e:
        tokenizer.build(TokenizerConfig(kind="gpt2"), foreign.parent / "no-corpus", foreign)
    assert f"{foreign} is an existing folder holding important.txt," in _one_line(e)
    _untouched(foreign)


def test_a_file_overwrites_a_file_and_replaces_a_symlink_not_its_target(tmp_path, foreign):
    path = tmp_path / "out.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    link = tmp_path / "link"
    link.symlink_to(foreign, target_is_directory=True)
    atomic_write_text(link, "three")
    assert not link.is_symlink() and link.read_text() == "three"
    _untouched(foreign)
