"""Every flag of every `python -m tadm` subcommand is read as a params key is: a typed flag
refuses a negative, a word, a float where an integer is meant and a huge value (each outside
its declared range) in one line, exit 2; no flag may be abbreviated; every output flag naming a
place nothing can be written (/proc) is refused in one line before any work."""

from __future__ import annotations

import argparse

import pytest

from tadm import cli

# a positional each subcommand needs to get as far as its flags
POSITIONALS = {"sample": ["models/tadm"], "profile": []}


def _subcommands():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _typed_flags():
    for name, sub in _subcommands().items():
        for action in sub._actions:
            if action.option_strings and action.type is not None and action.type is not str:
                yield name, action.option_strings[-1]


TYPED = sorted(set(_typed_flags()))


def test_the_walk_finds_the_typed_flags():
    assert {("sample", "--steps"), ("sample", "--refresh-every"), ("sample", "--num"), ("sample", "--seed"),
            ("count", "--vocab"), ("compute-column", "--steps"), ("train", "--replicate")} <= set(TYPED)


@pytest.mark.parametrize("command, flag", TYPED)
@pytest.mark.parametrize("value", ["-1", "abc", "2.5", str(10 ** 30)])
def test_a_bad_value_of_a_typed_flag_is_one_line_and_exit_2(command, flag, value, capsys):
    argv = [command, *POSITIONALS.get(command, []), f"{flag}={value}"]
    if command == "sample" and flag == "--sampler":
        pytest.skip("a registry name: a word is its type (tested below)")
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and flag in err and "Traceback" not in err, err


@pytest.mark.parametrize("command, flag", TYPED)
def test_zero_is_accepted_only_where_its_key_allows_it(command, flag, capsys):
    try:
        cli.build_parser().parse_args([command, *POSITIONALS.get(command, []), f"{flag}=0"])
    except SystemExit as e:
        err = capsys.readouterr().err.strip()
        assert e.code == 2 and err.count("\n") == 0 and flag in err, err


@pytest.mark.parametrize("argv, words", [
    (["sample", "models/tadm", "--ref", "3"], "unrecognized arguments: --ref"),
    (["throughput", "--run-b"], "unrecognized arguments: --run-b"),
    (["sample", "models/tadm", "--sampler", "bogus"], "no sampler 'bogus' is registered (known: mdlm"),
])
def test_no_flag_may_be_abbreviated_and_a_registry_flag_names_what_is_known(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and words in err, err


OUTPUT_FLAGS = [(c, f) for c, sub in _subcommands().items() for a in sub._actions for f in a.option_strings[-1:]
                if f in ("--out", "--table", "--metrics", "--blocks")]


@pytest.mark.parametrize("command, flag", OUTPUT_FLAGS)
def test_an_output_flag_where_nothing_can_be_written_is_refused_before_any_work(command, flag, capsys):
    argv = [command, *POSITIONALS.get(command, []), flag, "/proc/tadm-nowhere/x"]
    if command in ("table1-speed",):
        argv += ["--block", "1"]
    if command == "throughput" and flag == "--blocks":
        argv += ["--run-blocks"]
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and flag in err and "cannot be written" in err, err
