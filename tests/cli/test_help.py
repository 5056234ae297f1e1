"""``--help`` that names what each command does, in lines a terminal shows whole (issue #46)."""

import pytest

from streamwhiten.cli.app import SUMMARIES, cli

#: The widest help line: what a 100-column terminal (or docs/cli.md's code blocks) shows unwrapped.
WIDEST = 100
#: ``tune --help`` at 80 columns before issue #46 (it must not grow back).
TUNE_LINES_BEFORE = 141


def unwrapped(text: str) -> str:
    """Help text on one line, as click wrapped it (a word cut at its hyphen joined again)."""
    return " ".join(text.split()).replace("- ", "-")


@pytest.mark.parametrize("columns", ["80", "400"])
def test_every_help_line_of_every_command_fits_100_columns(run_cli, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)  # what click measures the terminal by
    for command in ["", *sorted(cli.commands)]:
        code, out, err = run_cli(*([command] if command else []), "--help")
        assert code == 0 and err == ""
        assert out.startswith(f"Usage: streamwhiten {command}".rstrip())
        long = [line for line in out.splitlines() if len(line) > WIDEST]
        assert not long, (command, columns, long)


def test_the_command_list_shows_every_summary_whole(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    listed = out.split("Commands:\n", 1)[1].splitlines()
    assert set(SUMMARIES) == set(cli.commands)
    for name, summary in SUMMARIES.items():
        assert f"  {name:<9}  {summary}" in listed, name  # one line: the name and its summary, not cut
    assert not any(line.endswith("...") for line in listed)


def test_tune_help_lists_the_storages_and_the_codes_a_budget_adds(run_cli):
    from streamwhiten.codes import CODES, TUNE_CODES
    from streamwhiten.evaluation.sweep import STORAGES

    code, out, _ = run_cli("tune", "--help")
    assert code == 0
    text = unwrapped(out)
    assert f"--dtypes ({', '.join(STORAGES)})" in text
    assert f"fit B: {', '.join(TUNE_CODES)} (faiss-*: with faiss installed" in text  # the registry's, in order
    assert set(TUNE_CODES) <= set(CODES)
    assert len(out.splitlines()) < TUNE_LINES_BEFORE  # concise: shorter than before, codes and all


def test_tune_help_follows_the_registry_not_a_copy(run_cli, monkeypatch):
    """The code list is made from :data:`streamwhiten.codes.TUNE_CODES` when the help is shown."""
    import streamwhiten.codes
    from streamwhiten.cli.tune import GeneratedHelp, _help

    monkeypatch.setattr(streamwhiten.codes, "TUNE_CODES", ("eigen", "faiss-pq"))
    command = GeneratedHelp("tune", make_help=_help)
    import click

    with click.Context(command, info_name="tune", terminal_width=100) as ctx:
        text = unwrapped(command.get_help(ctx))
    assert "fit B: eigen, faiss-pq (faiss-*" in text


def test_apply_and_eval_dtype_name_the_codes_they_take(run_cli):
    from streamwhiten.codes import CODES

    code, out, _ = run_cli("apply", "--help")
    assert code == 0
    assert "--dtype [float32|float16|int8|binary|NAME:BYTES]" in out
    text = unwrapped(out)
    assert f"NAME one of {', '.join(CODES)}" in text
    code, out, _ = run_cli("eval", "--help")
    assert code == 0 and "--dtype [float32|float16|int8|binary|NAME:BYTES]" in out


def test_apply_dtype_refuses_a_wrong_code_in_one_line_naming_the_codes(tmp_path, run_cli):
    code, _, err = run_cli(
        "apply", tmp_path / "m.npz", tmp_path / "in.h5", "-o", tmp_path / "o.h5", "--dtype", "eigen:x"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "Invalid value for '--dtype': a code is NAME:BYTES, NAME one of eigen, eigen-iso" in err
    code, _, err = run_cli(
        "apply", tmp_path / "m.npz", tmp_path / "in.h5", "-o", tmp_path / "o.h5", "--dtype", "float8"
    )
    assert code == 2 and err.count("NAME:BYTES") == 1  # said once
    assert not list(tmp_path.iterdir())


def test_the_generated_cli_page_fits_100_columns_and_names_the_codes():
    """docs/cli.md's reference is every command's help, made by the docs hook when the site is built."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = hooks.cli_reference()
    assert [line for line in text.splitlines() if len(line) > WIDEST] == []
    assert "--dtype [float32|float16|int8|binary|NAME:BYTES]" in text and "faiss-opq" in unwrapped(text)
