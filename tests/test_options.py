"""The option objects: checked against params.PARAMS when made, frozen, secrets never shown."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from streamwhiten import params
from streamwhiten.errors import BadInputError
from streamwhiten.options import (
    ApplyOptions,
    EngineOptions,
    FitOptions,
    ReadOptions,
    RetrievalOptions,
    Setting,
    StorageOptions,
    column_names,
)
from streamwhiten.storage import Storage


@pytest.mark.parametrize(
    "cls, name, bad",
    [
        (FitOptions, "precision", "float16"),
        (FitOptions, "checkpoint_every", 0),
        (FitOptions, "checkpoint_seconds", -1.0),
        (FitOptions, "skip_nonfinite", "yes"),
        (ApplyOptions, "dtype", "int4"),
        (ApplyOptions, "zarr_format", 4),
        (ApplyOptions, "compressor", "lzma"),
        (ApplyOptions, "progress_seconds", -0.5),
        (ApplyOptions, "normalize", 1),
        (EngineOptions, "threads", 0),
        (ReadOptions, "fill_missing_chunks", None),
        (RetrievalOptions, "bootstrap", -1),
        (RetrievalOptions, "seed", 1.5),
        (RetrievalOptions, "block_rows", 0),
        (RetrievalOptions, "threads", 0),
        (Setting, "beta", 1.5),
        (Setting, "n_components", 0),
    ],
)
def test_every_field_is_checked_in_the_words_of_params(cls, name, bad):
    with pytest.raises(BadInputError) as info:
        cls(**{name: bad})
    with pytest.raises(BadInputError) as expected:
        params.check(name, bad)
    assert str(info.value) == str(expected.value)


def test_defaults_are_the_declared_ones():
    for cls in (FitOptions, ApplyOptions, EngineOptions, ReadOptions, RetrievalOptions):
        for item in dataclasses.fields(cls):
            name = item.name
            if name in params.PARAMS and name != "remote_timeout":
                value = getattr(cls(), item.name)
                value = str(value) if isinstance(value, Storage) else value  # the dtype, parsed: its spelling
                assert value == params.default(name), (cls.__name__, item.name)


def test_block_rows_is_checked_under_its_own_name_and_replace_checks_again():
    with pytest.raises(BadInputError, match="^block_rows must be a whole number of at least 1, got 0$"):
        ReadOptions(block_rows=0)
    options = ReadOptions(block_rows=100)
    assert dataclasses.replace(options, block_rows=50).block_rows == 50
    with pytest.raises(BadInputError):
        dataclasses.replace(options, block_rows=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.block_rows = 7


def test_storage_options_are_frozen_pickle_and_never_show_their_values():
    secret = "sw-secret-value-123"
    options = ReadOptions(storage_options={"key": "id", "secret": secret, "client_kwargs": {"region_name": "eu"}})
    assert isinstance(options.storage_options, StorageOptions)
    assert secret not in repr(options) and secret not in str(options)
    assert options.storage_options["client_kwargs"]["region_name"] == "eu"
    assert options.storage_options.to_dict()["secret"] == secret
    with pytest.raises(TypeError):
        options.storage_options["key"] = "other"  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(options))
    assert copy == options and copy.storage_options.to_dict() == options.storage_options.to_dict()
    given = {"a": {"b": 1}}
    frozen = StorageOptions(given)
    given["a"]["b"] = 2  # a copy was taken
    assert frozen["a"]["b"] == 1


def test_the_remote_timeout_is_the_environments_where_not_given(monkeypatch):
    monkeypatch.delenv("STREAMWHITEN_REMOTE_TIMEOUT", raising=False)
    assert ReadOptions().remote_timeout == params.default("remote_timeout") == 10.0
    monkeypatch.setenv("STREAMWHITEN_REMOTE_TIMEOUT", "2.5")
    assert ReadOptions().remote_timeout == 2.5 and ReadOptions(remote_timeout=4).remote_timeout == 4.0
    monkeypatch.setenv("STREAMWHITEN_REMOTE_TIMEOUT", "soon")
    with pytest.raises(BadInputError, match="^STREAMWHITEN_REMOTE_TIMEOUT=soon: remote_timeout must be"):
        ReadOptions()
    with pytest.raises(BadInputError, match="^remote_timeout must be a number of seconds above 0, got 0$"):
        ReadOptions(remote_timeout=0)


def test_rules_between_fields():
    with pytest.raises(BadInputError, match="n_components"):
        Setting(n_components=4, variance=0.9)
    with pytest.raises(BadInputError, match="^scheduler and workers need engine='dask'$") as refused:
        EngineOptions(workers=2)
    assert refused.value.params == ("scheduler", "workers", "engine") and refused.value.param == "scheduler"
    with pytest.raises(BadInputError, match="^threads is for the serial engine; with engine='dask', use workers$"):
        EngineOptions(name="dask", threads=2)
    with pytest.raises(BadInputError, match="cannot be combined"):
        EngineOptions(name="dask", scheduler="tcp://h:1", workers=2)
    with pytest.raises(BadInputError, match="engine must be one of serial, dask"):
        EngineOptions(name="spark")
    with pytest.raises(BadInputError, match="resume or restart"):
        FitOptions(resume=True, restart=True)
    assert Setting(beta=0.5, n_components=3).given() == {"beta": 0.5, "n_components": 3}


def test_column_names():
    assert column_names("id, url,,") == ("id", "url")
    assert column_names(["id"]) == ("id",)
    assert column_names(None) == ()
    assert ApplyOptions(keep_columns="id,url").keep_columns == ("id", "url")
    with pytest.raises(BadInputError, match="^keep_columns names 'id' twice$") as refused:
        column_names("id,id")
    assert refused.value.param == "keep_columns"


def test_retrieval_options_take_a_path_and_column_names_and_refuse_other_things(tmp_path):
    assert RetrievalOptions(exclude=tmp_path / "ex.tsv").exclude == tmp_path / "ex.tsv"
    assert RetrievalOptions(query_id_column="id", corpus_id_column="doc").corpus_id_column == "doc"
    with pytest.raises(BadInputError, match=r"^exclude must be a file \(a path\), got 3$"):
        RetrievalOptions(exclude=3)
    with pytest.raises(BadInputError, match=r"^query_id_column must be a column name \(a string\), got 0$"):
        RetrievalOptions(query_id_column=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetrievalOptions().seed = 3  # type: ignore[misc]
