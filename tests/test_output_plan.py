"""The output plan: one value from the options to every writer (``streamwhiten.output_plan``).

Its attributes, read back from real outputs of every kind, give the same plan again; its is-current check
fails when any recorded field differs; its attributes and progress record are those apply wrote before
the plan existed (built here field by field, as apply built them, for the same settings).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
from conftest import anisotropic, write_h5

from streamwhiten import Whitener, __version__
from streamwhiten.core.model import load_model, map_checksum
from streamwhiten.core.quantize import Quantization
from streamwhiten.engine.apply import aligned_block_rows, apply_model, plan_output
from streamwhiten.io import RowRange, fingerprint, open_output, open_source, read_attrs
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.output_plan import OutputPlan, StoredAs, record_digest
from streamwhiten.records import ResumeRecord

#: every output kind this machine writes, with a name of each (Lance needs its extra)
KINDS = ["out.h5", "out.zarr", "out-v2.zarr", "out.parquet"]
DTYPES = ["float32", "float16", "int8", "binary"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("plan")
    rows = anisotropic(600, 8, seed=3).astype(np.float32)
    spec = write_h5(str(directory / "in.h5"), rows, chunk_rows=100)
    Whitener(n_components=5).fit(rows).save(str(directory / "m.npz"))
    return directory, spec, load_model(str(directory / "m.npz"))


def _plan(model, spec, output_spec, options, read=None, rows=None, sha=True):
    """The plan apply makes for these arguments (with the input's hash, as the is-current check has it)."""
    read = read or ReadOptions()
    options = options.storing(model.storage)
    with open_source(spec, read=read, min_rows=1) as opened:
        source = opened if rows is None else RowRange(opened, *rows)
        digest = fingerprint(source).sha256_sampled if sha else None
        return plan_output(model, source, open_output(output_spec, read), options, read, source_sha256=digest)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", KINDS)
def test_attributes_read_back_give_the_plan_again(tmp_path, fitted, name, dtype):
    _, spec, model = fitted
    out = str(tmp_path / name)
    options = ApplyOptions(dtype=dtype, zarr_format=2 if "v2" in name else 3)
    apply_model(model, spec, out, options, ReadOptions(block_rows=200))
    plan = _plan(model, spec, out, options, ReadOptions(block_rows=200))
    attrs = read_attrs(out)
    with open_source(out, codes=True) as written:
        stored = np.dtype(written.dtype).name
        assert written.shape == plan.shape and stored == plan.dtype
    back = OutputPlan.from_attrs(attrs, stored)
    assert back.matches(attrs, stored) and plan.matches(attrs, stored)
    recorded = ("width", "dtype", "storage", "kept_columns", "rows", "normalize", "skip_nonfinite")
    recorded += ("fill_missing_chunks", "model_checksum", "model_params", "source", "source_sha256")
    assert {key: getattr(back, key) for key in recorded} == {key: getattr(plan, key) for key in recorded}
    assert back.recorded_options() == plan.recorded_options()
    # and the plan's own attributes, as a store that keeps JSON gives them back
    assert OutputPlan.from_attrs(plan.to_attrs(), plan.dtype).to_attrs() == plan.to_attrs()


def test_the_attributes_are_those_apply_wrote_before_the_plan(tmp_path, fitted):
    """Field by field as apply's ``output_attrs`` and ``Output.create`` wrote them, in the same order."""
    directory, spec, model = fitted
    table = str(directory / "in.parquet")
    if not os.path.exists(table):
        import pyarrow as pa
        import pyarrow.parquet as pq

        with open_source(spec) as source:
            rows = source.read(0, source.n_rows)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), rows.shape[1])
        pq.write_table(pa.table({"id": np.arange(len(rows)), "emb": vectors}), table, row_group_size=100)
    out = str(tmp_path / "o.parquet")
    options = ApplyOptions(dtype="int8", keep_columns=("id",))
    with open_source(f"{table}:emb", min_rows=1) as opened:
        source = RowRange(opened, 100, 400)
        plan = plan_output(model, source, open_output(out), options, ReadOptions(), attrs={"job": "j"})
        label = source.label
    record = model.quantization("int8")
    expected = {
        "streamwhiten_version": __version__,
        "source": label,
        "model_checksum": map_checksum(model),
        "beta": model.beta,
        "gamma": model.gamma,
        "eps": model.eps,
        "eps_value": model.eps_value,
        "n_components": model.n_components,
        "normalized": True,
        "source_sha256": "0" * 64,
        "skip_nonfinite": False,
        "fill_missing_chunks": False,
        "kept_columns": ["id"],
        "dtype": "int8",
        "quantization": record.to_dict(),
        "rows": [100, 400],
        "job": "j",
        "complete": False,
        "n_nonfinite_rows": 0,
    }
    attrs = plan.to_attrs()
    assert list(attrs.items()) == list(expected.items())
    assert plan.commit_attrs(3, "ab" * 32) == {"job": "j", "n_nonfinite_rows": 3, "source_sha256": "ab" * 32}
    # a Zarr output records its format and compressor too; HDF5 its compressor; a plain store only its marks
    zarr_attrs = replace(plan, records_format=True, records_compressor=True, compressor="zstd").to_attrs()
    assert (zarr_attrs["zarr_format"], zarr_attrs["compressor"]) == (3, "zstd")
    bare = OutputPlan(10, 3).to_attrs()
    assert bare == {"complete": False, "n_nonfinite_rows": 0, "streamwhiten_version": __version__}


def test_matches_fails_when_any_recorded_field_differs(tmp_path, fitted):
    _, spec, model = fitted
    out = str(tmp_path / "o.zarr")
    options = ApplyOptions(dtype="int8")
    apply_model(model, spec, out, options, ReadOptions())
    plan = _plan(model, spec, out, options)
    attrs = read_attrs(out)
    assert plan.matches(attrs, "int8")
    binary = Quantization("binary", model.n_components, normalized=True)
    other_storage = StoredAs("binary", 1, "uint8", binary.to_dict(), binary.digest())
    changed = {
        "model_checksum": "f" * 64,
        "source_sha256": "e" * 64,
        "normalize": False,
        "storage": other_storage,
        "skip_nonfinite": True,
        "fill_missing_chunks": True,
        "zarr_format": 2,
        "compressor": "zstd",
        "kept_columns": ("id",),
        "rows": (0, 600),
    }
    for name, value in changed.items():
        assert not replace(plan, **{name: value}).matches(attrs, "int8"), name
    assert not replace(plan, storage=None).matches(attrs, "int8")  # floats are not codes
    assert not plan.matches({**attrs, "complete": False}, "int8")
    assert not plan.matches({**attrs, "quantization": "{not json"}, "int8")
    # a float output: its array's dtype, and no codes' record
    float_out = str(tmp_path / "f.zarr")
    apply_model(model, spec, float_out, ApplyOptions(dtype="float16"), ReadOptions())
    floats = _plan(model, spec, float_out, ApplyOptions(dtype="float16"))
    float_attrs = read_attrs(float_out)
    assert floats.matches(float_attrs, "float16")
    assert not floats.matches(float_attrs, "float32") and not floats.matches(float_attrs, None)
    assert not floats.matches({**float_attrs, "quantization": binary.to_dict()}, "float16")
    # an output written before --compressor existed was uncompressed
    old = {key: value for key, value in attrs.items() if key != "compressor"}
    assert plan.matches(old, "int8") and not replace(plan, compressor="zstd").matches(old, "int8")


@pytest.mark.parametrize(
    "options, read, rows",
    [
        (ApplyOptions(), ReadOptions(), None),
        (ApplyOptions(dtype="binary", zarr_format=2), ReadOptions(block_rows=150), (50, 550)),
        (ApplyOptions(dtype="int8", compressor="gzip", progress_seconds=0), ReadOptions(block_rows=300), None),
        (ApplyOptions(dtype="float16", skip_nonfinite=True, normalize=True), ReadOptions(), (0, 100)),
    ],
)
@pytest.mark.parametrize("name", ["o.zarr", "o.h5"])
def test_the_resume_record_is_the_one_apply_made_before_the_plan(tmp_path, fitted, options, read, rows, name):
    _, spec, model = fitted
    out = str(tmp_path / name)
    options = options.storing(model.storage)
    with open_source(spec, read=read, min_rows=1) as opened:
        source = opened if rows is None else RowRange(opened, *rows)
        output = open_output(out, read)
        plan = plan_output(model, source, output, options, read)
        printed = fingerprint(source)
        # as apply's _prepare_writing made it, field by field
        kind = str(options.dtype)
        quantization = model.quantization(kind) if kind in ("int8", "binary") else None
        width = model.n_components if quantization is None else quantization.width
        dtype = np.dtype(kind) if quantization is None else quantization.dtype
        chunk_rows = output.chunk_rows(width, dtype, source.n_rows, read.block_rows, source.default_block_rows())
        old = ResumeRecord(
            model_checksum=map_checksum(model),
            source=printed,
            output=os.path.abspath(out),
            normalize=bool(options.normalize),
            dtype=str(np.dtype(kind)) if quantization is None else quantization.kind,
            zarr_format=int(options.zarr_format),
            block_rows=aligned_block_rows(read.block_rows, source, chunk_rows),
            skip_nonfinite=bool(options.skip_nonfinite),
            threads=2,
            compressor=options.compressor,
            keep_columns=tuple(options.keep_columns),
            quantization=None if quantization is None else quantization.digest(),
            rows=rows,
        )
    made = plan.resume_record(printed, threads=2)
    assert made == old and made.to_dict() == old.to_dict()
    assert (plan.chunk_rows, plan.width, plan.dtype) == (chunk_rows, width, dtype.name)
    if quantization is not None:
        assert plan.storage is not None and plan.storage.digest == record_digest(quantization.to_dict())
