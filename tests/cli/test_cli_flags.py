"""The library names parameters, the command line flags: a library error carries the parameters its
message names (``params``), and the CLI's report (``streamwhiten.cli._flags.cli_message``) writes each as
its option. Each case is checked on both faces: the Python message and the command-line line."""

from __future__ import annotations

import numpy as np
import pytest

from streamwhiten.cli._flags import HELP, cli_message, flag
from streamwhiten.errors import BadInputError, MissingChunkError, OutputExistsError, StoreIOError
from streamwhiten.export import check_options
from streamwhiten.io._messages import name_not_found
from streamwhiten.options import EngineOptions, column_names
from streamwhiten.params import NAMES


def refusal(call, *args, **kwargs) -> BadInputError:
    with pytest.raises(BadInputError) as refused:
        call(*args, **kwargs)
    return refused.value


@pytest.mark.parametrize(
    ("call", "python", "command_line"),
    [
        (lambda: column_names("id,id"), "keep_columns names 'id' twice", "--keep-columns names 'id' twice"),
        (
            lambda: EngineOptions(workers=2),
            "scheduler and workers need engine='dask'",
            "--scheduler and --workers need --engine dask",
        ),
        (
            lambda: EngineOptions(name="dask", scheduler="tcp://h:1", workers=2),
            "workers sizes a local cluster; it cannot be combined with scheduler",
            "--workers sizes a local cluster; it cannot be combined with --scheduler",
        ),
        (
            lambda: check_options("faiss", normalize=True),
            "add an index factory such as index='Flat' for an IndexPreTransform, or drop normalize=True",
            "add an index factory such as --index Flat for an IndexPreTransform, or drop --normalize",
        ),
        (
            lambda: check_options("faiss", metric="ip"),
            "metric chooses how index compares vectors; give index too",
            "--metric chooses how --index compares vectors; give --index too",
        ),
        (
            lambda: check_options("npz", append_to="base"),
            "append_to is for the sentence-transformers format",
            "--append-to is for the sentence-transformers format",
        ),
    ],
)
def test_library_names_parameters_cli_names_flags(call, python, command_line):
    error = refusal(call)
    assert python in str(error) and "--" not in str(error)
    assert command_line in cli_message(error)


def test_overwrite_and_switches():
    error = OutputExistsError.at("out.h5")
    assert str(error) == "out.h5: already exists (pass overwrite=True to replace it)" and error.param == "overwrite"
    assert cli_message(error) == "out.h5: already exists (pass --overwrite to replace it)"
    switch = BadInputError("direct_io is for the serial engine", param="direct_io")
    assert cli_message(switch) == "--direct-io/--no-direct-io is for the serial engine"
    assert cli_message(BadInputError("pass checksums=False", param="checksums")) == "pass --no-checksums"


def test_a_named_value_alone_is_rewritten_where_the_word_is_prose():
    """``dataset='emb'`` names the parameter; "2-D dataset" in the same message is prose and stays."""
    error = name_not_found("in.h5", "/embeddings", "2-D dataset", ["/emb", "/x"])
    assert error.param == "dataset" and str(error).endswith("or with dataset='emb')")
    assert cli_message(error) == (
        "in.h5: has no 2-D dataset /embeddings; its 2-D datasets: /emb, /x (name one as in.h5:/emb, or with --dataset emb)"
    )


def test_a_wrapping_message_keeps_the_parameters_of_the_one_it_wraps():
    try:
        try:
            raise MissingChunkError("pass fill_missing_chunks=True to read it", param="fill_missing_chunks")
        except MissingChunkError as inner:
            raise BadInputError(f"in.zarr: {inner}") from None
    except BadInputError as outer:
        assert cli_message(outer) == "in.zarr: pass --fill-missing-chunks to read it"
    timeout = StoreIOError("s3://b/x: cannot read in 1 s (remote_timeout=0.3)", param="remote_timeout")
    assert isinstance(timeout, OSError) and cli_message(timeout).endswith("(--remote-timeout 0.3)")


def test_a_value_in_python_is_an_option_value_on_the_command_line():
    from streamwhiten.core import stats
    from streamwhiten.evaluation.sweep import SweepGrid

    huge = np.array([[3e38], [-3e38], [-3e38], [3e38]], dtype=np.float32)
    overflow = refusal(stats.block_moments, huge)
    assert "fit with precision='float64'" in str(overflow)
    assert "fit with --precision float64" in cli_message(overflow)
    rescore = refusal(SweepGrid, rescore=0)
    assert str(rescore) == "binary+rescore needs rescore=N of at least 1 (the candidates re-ranked)"
    assert cli_message(rescore) == "binary+rescore needs --rescore N of at least 1 (the candidates re-ranked)"


def test_an_error_naming_no_parameter_reads_the_same():
    error = BadInputError("in.h5: holds no 2-D dataset")
    assert error.params == () and error.param is None and cli_message(error) == str(error)
    assert cli_message(ValueError("keep_columns")) == "keep_columns"


def test_every_option_of_a_parameter_shows_its_help():
    """Help and flags live in the CLI: every option of a registry parameter is shown with the help of
    :data:`HELP` (or a command's own wording of it), never without."""
    import click

    from streamwhiten.cli.app import cli

    options = [p for command in cli.commands.values() for p in command.params if isinstance(p, click.Option)]
    of_params = [option for option in options if option.name in NAMES and not option.hidden]
    assert len(of_params) > 40
    for option in of_params:
        assert option.name in HELP, option.name
        assert flag(option.name) in option.opts + option.secondary_opts, option.name
