"""Guarded reading of a params or profile file: one ConfigError line for any problem.

A file that is not UTF-8, empty, not a mapping at the top, nested more than ``MAX_DEPTH``
levels, expanding (through YAML aliases) to more than ``MAX_NODES`` nodes, holding a key
twice in one mapping, or writing an integer in another base than decimal is refused, checked
on the YAML event stream before anything is built (no recursion, no expansion).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import yaml

from tadm.errors import ConfigError

MAX_BYTES = 4 * 1024 * 1024  # a params file is a few KiB
MAX_DEPTH = 32  # params nest 4 levels deep (posttrain.base / sft.hub_sources[i].keep_values)
MAX_NODES = 100_000  # YAML nodes after expanding aliases (params.yaml has about 500)


def _line(mark: Any) -> str:
    return f"line {mark.line + 1}" if mark is not None else "?"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _decode(data: bytes, source: str) -> str:
    """UTF-8 text of a file (a UTF-8 byte-order mark is allowed); anything else is one line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError("", f"not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset {e.start} (line {line}); "
                          "save the file as UTF-8", source=source) from None


def _scan(text: str, source: str) -> None:
    """Walk the YAML event stream (no recursion, nothing built) and refuse nesting deeper than
    MAX_DEPTH and documents that expand, through aliases, to more than MAX_NODES nodes (the
    'billion laughs' alias bomb): PyYAML would otherwise recurse past Python's limit while
    composing, or build a structure whose every later walk is exponential."""
    stack: list[list] = []  # open collections: [expanded node count, anchor]
    anchors: dict[str, int] = {}  # anchor -> expanded node count of the node it names
    documents = 0
    total = 0

    def add(n: int, event: Any) -> None:
        nonlocal total
        if stack:
            stack[-1][0] += n
            n = stack[-1][0]
        else:
            total += n
            n = total
        if n > MAX_NODES:
            raise ConfigError(_line(event.start_mark), f"the document expands to more than {MAX_NODES} YAML nodes "
                              "(aliases repeating aliases: an alias bomb?); a params file has a few hundred", source)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise ConfigError(_line(event.start_mark), "a second YAML document ('---'); a params file is one mapping", source)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) > MAX_DEPTH:
                raise ConfigError(_line(event.start_mark), f"nested more than {MAX_DEPTH} levels deep; "
                                  "params nest at most 4", source)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            n, anchor = stack.pop()
            if anchor is not None:
                anchors[anchor] = n
            add(n, event)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchors[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            add(anchors.get(event.anchor, 1), event)  # an undefined alias: the composer names it


def _check_duplicates(node: Any, prefix: str, source: str) -> None:
    """Refuse a key that appears twice in one mapping, at any depth (YAML would keep the last
    one silently). Iterative; a node reached again through an alias is checked once."""
    seen_nodes: set[int] = set()
    todo = [(node, prefix)]
    while todo:
        node, prefix = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[tuple, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    ident = (key_node.tag, key_node.value)
                    name = f"{prefix}.{key_node.value}" if prefix else key_node.value
                    line = key_node.start_mark.line + 1
                    if ident in first_line:
                        raise ConfigError(name, f"duplicate key on line {line} (first set on line {first_line[ident]}); "
                                          "YAML would silently keep the last one", source)
                    first_line[ident] = line
                    todo.append((value_node, name))
                else:
                    todo.append((value_node, prefix))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((child, f"{prefix}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int" and node.style is None:
            _check_decimal(node.value, prefix, node.start_mark.line + 1, source)


# YAML 1.1 (PyYAML) reads 010 as 8, 0x10 as 16, 0b10 as 2 and 1:30 as 90: a params file means decimal
_DECIMAL = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")


def _check_decimal(text: str, name: str, line: int, source: str) -> None:
    if not _DECIMAL.match(text):
        raise ConfigError(name, f"{text!r} on line {line} is not a decimal integer (YAML would read it as "
                          f"{yaml.safe_load(text)!r}: a leading 0 is octal, 0x / 0b other bases, a : base 60); "
                          "write it in decimal", source)


def read_yaml(path: Path, source: Optional[str] = None) -> dict:
    """The top-level mapping of a params or profile file; every problem is one ConfigError line
    naming the file (`source`, default the path)."""
    source = source or str(path)
    if not path.exists():
        raise ConfigError("", "file does not exist (create it with `python -m tadm profile default`)", source=source)
    if not path.is_file():
        raise ConfigError("", "is not a regular file (a device, a directory or a pipe; a params file is YAML text)",
                          source=source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError("", f"cannot be read ({e.strerror or e})", source=source) from None
    if len(data) > MAX_BYTES:
        raise ConfigError("", f"is {len(data)} bytes; a params file is a few KiB (limit {MAX_BYTES})", source=source)
    text = _decode(data, source)
    try:
        _scan(text, source)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_duplicates(node, "", source)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        if mark is None and isinstance(e, yaml.reader.ReaderError):
            where = f"character {e.position}"
            problem = f"character {e.character!r} is not allowed in YAML"
        else:
            where = _line(mark)
            problem = getattr(e, "problem", None) or e
        raise ConfigError(where, f"not valid YAML ({_one_line(problem)})", source=source) from None
    except RecursionError:  # not expected after _scan's depth bound; never a traceback
        raise ConfigError("", f"nested too deeply (more than {MAX_DEPTH} levels)", source=source) from None
    if data is None:
        raise ConfigError("", "is empty; a params file sets every key (render one with "
                          "`python -m tadm profile default`)", source=source)
    if not isinstance(data, dict):
        got = "a list" if isinstance(data, list) else type(data).__name__
        raise ConfigError("(top level)", f"must be a mapping of sections, got {got}", source=source)
    return data
