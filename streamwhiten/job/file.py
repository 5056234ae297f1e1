"""A ``job.toml`` file: its tables and keys, checked, as option objects.

    name = "nightly"                  # optional; default: the file's name without extension
    [input]
    paths = ["shards/day-*.zarr"]     # globs and directories of Parquet shards allowed
    dataset = "/embeddings"           # + the [input] parameters of PARAMS (fill_missing_chunks, ...)
    [model]
    path = "models/nightly.npz"       # + the [model] parameters (beta, gamma, n_components, precision, ...)
    [apply]                           # optional
    output = "reduced/{stem}.zarr"    # {stem}: the input's name; {name}: the job's
                                      # + the [apply] parameters (normalize, dtype, compressor, ...)
    [publish]                         # optional (needs [apply]): versioned outputs, appended to nightly
    max_staleness = 0.5               # + keep_versions (see job.publish and docs/nightly.md)
    [storage]                         # optional: keyword arguments of the file systems of URLs

Each table's parameters are those `streamwhiten.params.job_keys` lists; a mistake is one `BadInputError`
naming the file and the key. Relative paths are taken from the job file's directory.
"""

from __future__ import annotations

import os
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .. import params as _params
from ..errors import BadInputError
from ..options import ApplyOptions, EngineOptions, FitOptions, PublishOptions, ReadOptions, Setting
from ..pipeline import default_checkpoint

#: Keys of each table that are not parameters, with the type their value must have.
OWN_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "": {"name": str, "input": dict, "model": dict, "apply": dict, "publish": dict, "storage": dict},
    "input": {"paths": (list, str), "dataset": str},
    "model": {"path": str},
    "apply": {"output": str},
    "publish": {},
}


@dataclass(frozen=True)
class Fitting:
    """How a job keeps its statistics: model file, ``[model]`` setting, fit options, ``read``, ``engine``."""

    model_path: str
    setting: Setting
    options: FitOptions
    read: ReadOptions
    engine: EngineOptions

    @property
    def checkpoint(self) -> str:
        return default_checkpoint(self.model_path)


@dataclass(frozen=True)
class Writing:
    """How a job writes its outputs: its ``[apply]`` options, how it reads the inputs for them (``[apply]``
    block size), and the engine that runs the blocks."""

    options: ApplyOptions
    read: ReadOptions
    engine: EngineOptions


@dataclass(frozen=True)
class JobFile:
    """A checked ``job.toml``: paths absolute, every setting an option object (``read``: the fit's reading,
    ``apply_read``: the apply's; ``apply``, ``output``, ``publish``: None without their tables)."""

    path: str
    name: str
    inputs: tuple
    model_path: str
    setting: Setting = field(default_factory=Setting)
    fit: FitOptions = field(default_factory=FitOptions)
    fit_engine: EngineOptions = field(default_factory=EngineOptions)
    read: ReadOptions = field(default_factory=ReadOptions)
    apply: ApplyOptions | None = None
    apply_engine: EngineOptions = field(default_factory=EngineOptions)
    apply_read: ReadOptions = field(default_factory=ReadOptions)
    output: str | None = None
    publish: PublishOptions | None = None

    @property
    def lock_path(self) -> str:
        """One lock per model file: two job files keeping the same model never run at once."""
        head, tail = os.path.split(self.model_path)
        return os.path.join(head, f".{tail}.lock")

    @property
    def checkpoint(self) -> str:
        return default_checkpoint(self.model_path)

    @property
    def fitting(self) -> Fitting:
        """How the job keeps its statistics."""
        return Fitting(self.model_path, self.setting, self.fit, self.read, self.fit_engine)

    @property
    def writing(self) -> Writing:
        """How the job writes its outputs (a job with an ``[apply]`` table)."""
        assert self.apply is not None
        return Writing(self.apply, self.apply_read, self.apply_engine)

    @property
    def own_files(self) -> dict[str, str]:
        """The model file, its checkpoint and the lock, each with what it is."""
        return {self.model_path: "model file", self.checkpoint: "checkpoint", self.lock_path: "lock file"}

    def inputs_and_outputs(self) -> tuple[list, dict]:
        """The job's inputs now (globs expanded) and each one's output, refusing two inputs in one output."""
        from ..io import expand_specs, remote, split_spec

        inputs = expand_specs(list(self.inputs), self.read)
        outputs: dict = {}
        if self.apply is None or self.output is None:
            return inputs, outputs
        used: dict = {}
        for input_spec in inputs:
            output = output_for(self.output, input_spec, self.name, self.path)
            store = split_spec(output)[0]  # each output is a whole file or store
            store = remote.normalize(store) if remote.is_url(store) else os.path.realpath(store)
            if store in used:
                raise BadInputError(
                    f"{self.path}: [apply] output '{self.output}' puts two inputs in "
                    f"{store}; each input needs its own file or store (e.g. 'out/{{stem}}.zarr')"
                )
            used[store] = input_spec
            outputs[input_spec] = output
        return inputs, outputs


def _load(path: str) -> dict:
    """The TOML tables of the job file ``path`` (a readable, UTF-8 file)."""
    from .._paths import read_file

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    text = read_file(path, "job file")
    try:
        return tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInputError(
            f"{path}: not a valid TOML job file (TOML is UTF-8 text; byte {text[exc.start]:#04x} at offset "
            f"{exc.start} is not UTF-8)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{path}: not a valid TOML job file ({exc})") from None


def _check_tables(path: str, data: dict) -> None:
    """Refuse unknown keys, wrong types, values out of range and NUL bytes, naming the file and key."""
    from ..records import nul_field

    found = nul_field(data)
    if found is not None:
        section, _, key = found.partition(".")
        where = f"{key} in [{section}]" if key and isinstance(data.get(section), dict) else found
        raise BadInputError(f"{path}: {where} holds a NUL byte (\\u0000), which no path or name can hold")
    for section, own in OWN_KEYS.items():
        table = data if section == "" else data.get(section, {})
        where = f"[{section}]" if section else "the top level"
        allowed = set(own) | (set(_params.job_keys(section)) if section else set())
        unknown = set(table) - allowed
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in {where}")
        for key, value in table.items():
            if value is None:
                continue
            if key not in own:
                _params.check(key, value, f"{path}: {key} in {where}")
                continue
            kind = own[key]
            kinds = kind if isinstance(kind, tuple) else (kind,)
            if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
                names = " or ".join(kind.__name__ for kind in kinds)
                raise BadInputError(f"{path}: {key} in {where} must be of type {names}, got {value!r}")


def _given(table: dict, cls: type) -> dict:
    """The keys of ``table`` that are fields of the option class ``cls`` (former names counting as theirs)."""
    names = {item.name for item in fields(cls)}
    found = {}
    for key, value in table.items():
        name = _params.PARAMS[key].alias_of or key if key in _params.PARAMS else key
        if name in names:
            found[name] = value
    return found


def read_job_file(path: str, storage_options: Any = None) -> JobFile:
    """Parse and check a job file; every mistake is one `BadInputError` naming the file and key.
    ``storage_options`` (the command line's ``--storage-option``) are used over the ``[storage]`` table."""
    from ..io import remote

    data = _load(path)
    _check_tables(path, data)
    base = os.path.dirname(os.path.abspath(path))

    def absolute(name: str) -> str:  # ``a/../shards`` as ``shards``: as the manifest names it
        if remote.is_url(name):
            return remote.local_path(name)
        return os.path.normpath(remote.local_path(name) if os.path.isabs(name) else os.path.join(base, name))

    section = {name: data.get(name, {}) for name in ("input", "model")}
    inputs = section["input"].get("paths")
    inputs = [inputs] if isinstance(inputs, str) else inputs
    if not inputs or not all(isinstance(item, str) for item in inputs):
        raise BadInputError(f"{path}: [input] paths must list at least one input store (globs allowed)")
    if "path" not in section["model"]:
        raise BadInputError(f"{path}: [model] path (the model file to keep up to date) is required")
    model_path = absolute(section["model"]["path"])
    if remote.is_url(model_path):
        raise BadInputError(f"{path}: [model] path must be a local file (inputs and [apply] outputs may be URLs)")
    name = str(data.get("name") or os.path.splitext(os.path.basename(path))[0])
    given = storage_options.to_dict() if hasattr(storage_options, "to_dict") else dict(storage_options or {})
    storage = {**remote.options_from(data.get("storage") or {}), **given}
    remote.remember_secrets(storage)
    inputs_table = {**section["input"], "storage_options": storage or None}
    read = ReadOptions(**_given(inputs_table, ReadOptions), **_given(section["model"], ReadOptions))
    job = JobFile(
        path,
        name,
        tuple(absolute(item) for item in inputs),
        model_path,
        Setting(**_given(section["model"], Setting)),
        FitOptions(**_given(section["model"], FitOptions)),
        EngineOptions(**_given(section["model"], EngineOptions)),
        read,
    )
    table = data.get("apply")
    job = job if table is None else _with_apply(job, table, inputs_table, absolute)
    if "publish" in data:
        if job.apply is None:
            raise BadInputError(
                f"{path}: [publish] publishes the outputs of [apply]: add an [apply] table with an output template"
            )
        job = replace(job, publish=PublishOptions(**_given(data["publish"], PublishOptions)))
    return job


def _with_apply(job: JobFile, table: dict, inputs_table: dict, absolute: Callable[[str], str]) -> JobFile:
    """``job`` with its ``[apply]`` table: the output template checked, the options made."""
    if "output" not in table:
        raise BadInputError(f"{job.path}: [apply] output is required, e.g. 'reduced/{{stem}}.zarr'")
    check_output_template(job.path, table["output"])
    if "name" in template_fields(table["output"]):
        check_field(job.path, "name", job.name, f"the job's name ({job.name!r}, the name key or the job file's)")
    try:  # the options' own checks of each other (int8 codes and bits hold no NaN rows, ...)
        apply = ApplyOptions(**_given(table, ApplyOptions), overwrite=True)
    except BadInputError as exc:
        raise BadInputError(f"{job.path}: [apply] {exc}") from None
    return replace(
        job,
        apply=apply,
        apply_engine=EngineOptions(**_given(table, EngineOptions)),
        apply_read=ReadOptions(**_given(inputs_table, ReadOptions), **_given(table, ReadOptions)),
        output=absolute(table["output"]),
    )


# ------------------------------------------------------------------------------------ output templates

#: The fields an ``[apply] output`` template may use.
OUTPUT_FIELDS = "{stem} (the input's file name without extension) and {name} (the job's name)"


def template_fields(text: str):
    """The names of the fields of the template ``text`` (``ValueError`` for unbalanced braces)."""
    for _, name, spec, _ in string.Formatter().parse(text):
        if name is not None:
            yield name
            yield from template_fields(spec or "")  # a field nested in a format spec, as in {stem:{width}}


def check_output_template(path: str, template: str) -> None:
    """Refuse an ``[apply] output`` template that `output_for` could not fill, naming the bad field."""
    where = f"{path}: output in [apply] ({template!r})"
    try:
        names = list(template_fields(template))
    except ValueError as exc:  # unbalanced braces
        raise BadInputError(
            f"{where}: not a valid template ({exc}; write a literal brace as {{{{ or }}}}); "
            f"the fields are {OUTPUT_FIELDS}"
        ) from None
    for name in names:
        if name == "" or name.isdigit():
            raise BadInputError(f"{where}: positional field {{{name}}} is not allowed; the fields are {OUTPUT_FIELDS}")
        if name not in ("stem", "name"):
            raise BadInputError(f"{where}: unknown field {{{name}}}; the fields are {OUTPUT_FIELDS}")
    try:
        template.format(stem="stem", name="name")
    except ValueError as exc:  # a format spec or conversion that does not apply to a string
        raise BadInputError(f"{where}: cannot be filled in ({exc}); the fields are {OUTPUT_FIELDS}") from None


def check_field(path: str, name: str, value: str, what: str) -> None:
    """Refuse a template's ``{name}`` value that would leave the output's folder: a separator, ``..``, ``.``, ''."""
    if value in ("", ".", "..") or any(sep in value for sep in ("/", "\\", os.sep, os.altsep or "/", "\0")):
        raise BadInputError(
            f"{path}: {{{name}}} in the [apply] output would be {what}, which holds a path separator or is "
            f"'.' or '..': an output must stay in its folder; rename it, or leave {{{name}}} out"
        )


def output_for(template: str, input_spec: str, job_name: str, job_path: str = "job file") -> str:
    """The output of ``input_spec``: ``template`` filled with its ``{stem}`` and the job's ``{name}``."""
    from ..io import split_spec

    path, _ = split_spec(input_spec)
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0]
    names = set(template_fields(template))
    if "stem" in names:
        check_field(job_path, "stem", stem, f"{stem!r}, from the input {path}")
    if "name" in names:
        check_field(job_path, "name", job_name, f"the job's name ({job_name!r})")
    return template.format(stem=stem, name=job_name)


__all__ = [
    "Fitting",
    "JobFile",
    "OUTPUT_FIELDS",
    "check_output_template",
    "default_checkpoint",
    "output_for",
    "read_job_file",
    "template_fields",
    "Writing",
]
