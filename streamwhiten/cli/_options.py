"""Command-line options made from the registry (`streamwhiten.params.PARAMS`; flags and help in `_flags`),
and the frozen option objects (`streamwhiten.options`) made from what was parsed (`objects`, `take`).
A renamed parameter's former flag (``--chunk-rows``) is still taken, hidden from ``--help``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import fields
from inspect import signature
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import BadInputError
from ..params import PARAMS
from ._flags import HELP, SWITCHES, cli_message, flags

if TYPE_CHECKING:
    from ..options import EngineOptions, ReadOptions

_T = TypeVar("_T")
_V = TypeVar("_V")


class SpecType(click.ParamType):
    """An option checked against `PARAMS`, refused in its words (``Invalid value for '--beta': ...``, exit 2)."""

    def __init__(self, name: str):
        self.param = PARAMS[name]
        self.name = self.param.kind.__name__

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, str) and self.param.kind in (int, float):
            try:
                value = self.param.kind(value)
            except ValueError:
                pass  # refused below, in the parameter's own words
        try:
            return self.param.check(value)
        except BadInputError as exc:
            self.fail(cli_message(exc), param, ctx)


class SpecChoice(click.Choice):
    """A parameter with choices (listed in ``--help``), refused in the words of `PARAMS`."""

    def __init__(self, name: str):
        self.param = PARAMS[name]
        super().__init__([str(choice) for choice in self.param.choices])

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if (
            self.param.kind is int
            and isinstance(value, str)
            and value.lstrip("-").isascii()
            and value.lstrip("-").isdigit()
        ):
            value = int(value)
        try:
            return self.param.check(value)
        except BadInputError as exc:
            self.fail(cli_message(exc), param, ctx)


class NamesType(click.ParamType):
    """A comma-separated list of names (``--keep-columns id,url``)."""

    name = "names"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        from ..options import column_names

        try:
            return column_names(value)
        except BadInputError as exc:
            self.fail(cli_message(exc), param, ctx)


def spec_type(name: str) -> click.ParamType:
    """The click type of parameter ``name``, checked against `PARAMS`."""
    param = PARAMS[name]
    if param.kind is tuple:
        return NamesType()
    return SpecChoice(name) if param.choices else SpecType(name)


def param_option(name: str, *, default: object = ..., help: str | None = None, show_default: bool | None = None):
    """The click option of parameter ``name``: flags, type, help and its default (or ``default``)."""
    param = PARAMS[name]
    text = help if help is not None else HELP.get(name, "")
    if param.kind is bool:
        value = param.default if default is ... else default
        if name in SWITCHES:
            flag = flags(name)[0]
            return click.option(f"{flag}/--no-{flag[2:]}", name, default=value, show_default=True, help=text)
        return click.option(*flags(name), name, is_flag=True, default=bool(value), help=text)
    value = param.default if default is ... else default
    shown = show_default if show_default is not None else value is not None
    return click.option(*flags(name), name, type=spec_type(name), default=value, show_default=shown, help=text)


def alias_option(alias: str):
    """A renamed parameter's former flag, hidden from ``--help``; `take` folds its value in."""
    return click.option(
        "--" + alias.replace("_", "-"), alias, type=spec_type(alias), default=None, hidden=True, expose_value=True
    )


def param_options(*names: str, defaults: dict | None = None, helps: dict | None = None):
    """Decorate a command with the options of ``names`` (and former flags); ``defaults``/``helps`` override."""
    defaults, helps = defaults or {}, helps or {}

    def decorate(func: Callable[..., Any]):
        for name in reversed(names):
            for alias in PARAMS[name].aliases:
                func = alias_option(alias)(func)
            func = param_option(name, default=defaults.get(name, ...), help=helps.get(name))(func)
        return func

    return decorate


def take(cls: type[_T], **values: object) -> _T:
    """An instance of ``cls`` from the parsed ``values`` (former flags included); None keeps a non-None default."""
    kwargs: dict[str, object] = {}
    for item in fields(cls):  # type: ignore[arg-type]
        names = (item.name, *(PARAMS[item.name].aliases if item.name in PARAMS else ()))
        if not any(name in values for name in names):
            continue
        value = first_given(*(values.get(name) for name in names))
        if value is not None or item.default is None:
            kwargs[item.name] = value
    return cls(**kwargs)


def first_given(*values: _V | None) -> _V | None:
    """The first of ``values`` that is not None, else None."""
    return next((value for value in values if value is not None), None)


#: The whitening's parameters: left out, a fit takes their defaults and the other commands the model's.
SETTING = ("beta", "gamma", "n_components", "variance", "eps")


def setting_options(purpose: str = "fit"):
    """``--beta --gamma -k --variance --eps``: for a fit their defaults, elsewhere the model's saved setting."""
    if purpose == "fit":
        shown = {"beta": "1", "gamma": "1", "n_components": "all d", "eps": f"{PARAMS['eps'].default:g}"}
    else:
        shown = dict.fromkeys(SETTING, "the model's")
    helps = {name: f"{HELP[name]} [default: {shown[name]}]" if name in shown else HELP[name] for name in SETTING}
    return param_options(*SETTING, defaults=dict.fromkeys(SETTING), helps=helps)


quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress: no bar on a terminal, no timed line per phase on stderr when piped. The summary is "
    "still printed on stdout (redirect it, or take --json); errors go to stderr.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON summary.")


def storage_options(func: Callable[..., Any]):
    """``--storage-option KEY=VALUE`` (repeatable) and ``--remote-timeout``: how URLs are reached."""
    func = param_option("remote_timeout", default=None, show_default=False)(func)
    return click.option(
        "--storage-option",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        help=HELP["storage_options"],
    )(func)


def engine_options(func: Callable[..., Any]):
    """``--engine --scheduler --workers --threads``: which engine runs the blocks."""
    func = param_option("threads", default=None)(func)
    func = param_option("workers", default=None)(func)
    func = click.option(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="With --engine dask: the scheduler to use, e.g. tcp://host:8786 (default: a local cluster).",
    )(func)
    return click.option(
        "--engine",
        "engine",
        type=click.Choice(["serial", "dask"]),
        default="serial",
        show_default=True,
        help="serial: this process; dask: a Dask cluster (needs streamwhiten[dask]), see docs/dask.md.",
    )(func)


def read_options(
    *,
    dataset: str | None = None,
    block_rows: int | None = None,
    chunk_rows: int | None = None,
    fill_missing_chunks: bool | None = None,
    storage_options: tuple[str, ...] = (),
    remote_timeout: float | None = None,
) -> ReadOptions:
    """The `ReadOptions` of what was parsed."""
    from ..io import remote
    from ..options import ReadOptions

    storage = remote.options_from(storage_options) if storage_options else None
    remote.remember_secrets(storage)  # every message hides their secret values from now on
    return take(
        ReadOptions,
        dataset=dataset,
        block_rows=first_given(block_rows, chunk_rows),
        fill_missing_chunks=fill_missing_chunks,
        storage_options=storage,
        remote_timeout=remote_timeout,
    )


def engine_of(engine: str, threads: int | None, scheduler: str | None, workers: int | None) -> EngineOptions:
    """The `EngineOptions` of ``--engine --threads --scheduler --workers``."""
    from ..options import EngineOptions

    return take(EngineOptions, name=engine, threads=threads, scheduler=scheduler, workers=workers)


def block_rows_of(block_rows: int | None = None, chunk_rows: int | None = None) -> int | None:
    """``--block-rows``, else its former name ``--chunk-rows`` (None: neither given)."""
    return first_given(block_rows, chunk_rows)


def objects(**makers: Callable[..., object]):
    """Hand a command each group of its options as one object: with ``objects(read=read_options)`` it gets
    ``read=read_options(**those)`` instead of those values; made in order, before the command runs."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def command(*args: Any, **values: Any) -> Any:
            for name, make in makers.items():
                group = {key: values.pop(key) for key in signature(make).parameters if key in values}
                values[name] = make(**group)
            return func(*args, **values)

        return command

    return decorate


def pipeline_options(options: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Fit's and apply's storage, engine, ``--quiet`` and ``--json`` options; the command gets ``read``,
    ``setting``, ``options`` (an ``options`` instance) and ``engine`` (`objects`)."""
    from ..options import Setting

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = objects(read=read_options, setting=Setting, options=options, engine=engine_of)(func)
        return storage_options(engine_options(quiet_option(json_option(func))))

    return decorate


def given_names(ctx: click.Context, names: Iterable[str]) -> tuple:
    """The parameters among ``names`` set on the command line (not left to their default)."""
    from click.core import ParameterSource

    return tuple(name for name in names if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE)
