"""Corpus sources and MDLM's train/validation split."""

import json

import pytest

from tadm.config import CorpusConfig
from tadm.data import corpus
from tadm.errors import DataError
from tadm.io import read_jsonl


def test_strip_markdown_keeps_text_drops_markup():
    md = "# Play\n\n### SCENE I. A room.\n\n_Enter HAMLET_\n\n**HAMLET**  \nTo be, or not\\-to be  \n__\\[Aside]_  \n"
    assert corpus.strip_markdown(md) == "Play\n\nSCENE I. A room.\n\nEnter HAMLET\n\nHAMLET\nTo be, or not-to be\n[Aside]"


def test_shakespeare_is_775_scenes_of_plain_text():
    docs = list(corpus.shakespeare_documents())
    assert len(docs) == 775
    text = "\n".join(docs)
    assert 4_500_000 < len(text) < 5_500_000
    for mark in ("**", "###", "\\[", "_Enter"):
        assert mark not in text
    assert "To be, or not to be: that is the question" in text


def test_mdlm_split_last_documents_validate(tmp_path):
    files = []
    for i in range(7):
        f = tmp_path / "docs" / f"doc{i}.txt"
        f.parent.mkdir(exist_ok=True)
        f.write_text(f"document number {i}\n")
        files.append(f)
    cfg = CorpusConfig(source="local", local_paths=[str(tmp_path / "docs" / "*.txt")], validation_docs=2)
    m = corpus.build(cfg, tmp_path / "out")
    train = [r["text"] for r in read_jsonl(tmp_path / "out" / "train.jsonl")]
    valid = [r["text"] for r in read_jsonl(tmp_path / "out" / "validation.jsonl")]
    assert train == [f"document number {i}\n" for i in range(5)]
    assert valid == [f"document number {i}\n" for i in (5, 6)]
    assert m["counts"]["train"]["documents"] == 5 and m["counts"]["validation"]["documents"] == 2
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(on_disk["sha256"]) == {"train.jsonl", "validation.jsonl"}


def test_too_many_validation_docs_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("only one")
    cfg = CorpusConfig(source="local", local_paths=[str(tmp_path / "a.txt")], validation_docs=1)
    with pytest.raises(DataError, match="corpus.validation_docs"):
        corpus.build(cfg, tmp_path / "out")
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_openwebtext_code_path_on_a_local_stand_in(tmp_path):
    """The paper's loader (`datasets.load_dataset`) on a local dataset directory."""
    src = tmp_path / "owt"
    src.mkdir()
    rows = [{"text": f"web page {i} about topic {i % 3}."} for i in range(12)]
    (src / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = CorpusConfig(source="openwebtext", hf_dataset=str(src), hf_split="train", validation_docs=3)
    m = corpus.build(cfg, tmp_path / "out")
    assert m["counts"]["train"]["documents"] == 9 and m["counts"]["validation"]["documents"] == 3
    valid = [r["text"] for r in read_jsonl(tmp_path / "out" / "validation.jsonl")]
    assert valid == [r["text"] for r in rows[-3:]]

    cfg = CorpusConfig(source="openwebtext", hf_dataset=str(src), validation_docs=3, max_docs=6)
    assert corpus.build(cfg, tmp_path / "out2")["counts"]["validation"]["documents"] == 3
    assert corpus.build(cfg, tmp_path / "out2")["counts"]["train"]["documents"] == 3


def test_openwebtext_missing_dataset_is_one_line(tmp_path):
    cfg = CorpusConfig(source="openwebtext", hf_dataset=str(tmp_path / "missing"), validation_docs=1)
    with pytest.raises(DataError, match="corpus.hf_dataset") as err:
        corpus.build(cfg, tmp_path / "out")
    assert "\n" not in str(err.value)
