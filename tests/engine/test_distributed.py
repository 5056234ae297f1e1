"""The Dask engine against independent references: numpy float64 two-pass moments and the serial engine.

One module-wide LocalCluster of 2 worker processes serves most tests; the worker-kill test starts its
own. Float32 arithmetic (``precision="auto"`` on float32 data) is compared with the serial engine at
the same block layout and one BLAS thread, as on the workers: OpenBLAS's float32 products differ
with the thread count itself (about 1e-10 relative here), which no engine can remove. Float64
arithmetic is compared across any layout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, needs, optional_module

pytestmark = needs(
    "dask", "distributed", reason="the Dask engine needs dask[distributed]: pip install 'streamwhiten[dask]'"
)
da = optional_module("dask.array")
distributed = optional_module("distributed")
dask = optional_module("dask")


@pytest.fixture(autouse=True, scope="module")
def _distributed_config():
    """distributed adds its settings (``distributed.comm``, ``distributed.scheduler``) to dask's config when it
    is imported: before any test here reads or sets them (the module itself imports it on first use)."""
    import distributed as loaded  # noqa: F401


import h5py  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from streamwhiten.cli import main  # noqa: E402
from streamwhiten.core.model import finalize, load_model  # noqa: E402
from streamwhiten.engine import distributed as sd  # noqa: E402
from streamwhiten.engine.apply import apply_model  # noqa: E402
from streamwhiten.engine.engines import DaskEngine  # noqa: E402
from streamwhiten.engine.fit import fit_sources  # noqa: E402
from streamwhiten.errors import (  # noqa: E402
    BadInputError,
    ClusterError,
    NonFiniteError,
    NothingToDoError,
    OutputExistsError,
    StoreIOError,
)
from streamwhiten.io import lazy_rows, open_source, partial_path, read_attrs  # noqa: E402
from streamwhiten.options import ApplyOptions, ReadOptions  # noqa: E402
from streamwhiten.output_plan import OutputPlan  # noqa: E402
from streamwhiten.progress import Watch  # noqa: E402
from streamwhiten.synthetic import generate_rows, write_store  # noqa: E402
from streamwhiten.whitener import Whitener  # noqa: E402

ROOT = str(REPO)
TOL = 1e-12


def rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


def two_pass(rows):
    """Mean and centred scatter in float64, the textbook way."""
    rows = np.asarray(rows, dtype=np.float64)
    mean = rows.mean(axis=0)
    centred = rows - mean
    return mean, centred.T @ centred


def assert_moments_close(state, mean, scatter, n_rows, tol=TOL):
    assert state.n_rows == n_rows
    assert rel(state.mean, mean) <= tol
    assert rel(state.scatter, scatter) <= tol


def serial_one_thread(*args, **kwargs):
    """The serial engine with one BLAS thread, the arithmetic each Dask worker process runs."""
    with threadpool_limits(1):
        return fit_sources(*args, **kwargs)


def read_all(spec):
    with open_source(spec) as source:
        return source.read(0, source.n_rows)


@pytest.fixture(scope="module")
def client():
    with sd.dask_client(n_workers=2) as active:
        yield active


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    h5 = write_store(str(root / "a.h5"), 10_000, 24, seed=0, chunk_rows=1000)
    zr = write_store(str(root / "b.zarr"), 7_000, 24, seed=1, chunk_rows=512)
    nan = str(root / "nan.h5")
    write_store(nan, 6_000, 24, seed=2, chunk_rows=500)
    with h5py.File(nan, "r+") as handle:
        handle["embeddings"][1234, 3] = np.nan
        handle["embeddings"][5678, 0] = np.inf
    return SimpleNamespace(root=root, h5=h5, zarr=zr, nan=nan + ":/embeddings")


@pytest.fixture(scope="module")
def data64():
    rng = np.random.default_rng(7)
    return rng.standard_normal((5_000, 12)) @ rng.standard_normal((12, 12)) + 40.0


# ------------------------------------------------------------------------------------ core install


def test_core_install_needs_no_dask(tmp_path):
    """With dask unimportable, the package, the serial engine and the CLI work; --engine dask explains."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((50, 4)))
    code = f"""
import sys
sys.modules.update(dask=None, distributed=None)
import numpy as np
import streamwhiten, streamwhiten.cli.app, streamwhiten.engine.fit, streamwhiten.engine.apply, streamwhiten.engine.distributed
from streamwhiten.whitener import Whitener
Whitener().fit(np.load({str(tmp_path / "x.npy")!r}))
from streamwhiten.cli import main
command = sys.argv[1]
if command == 'fit':
    assert main(['fit', {str(tmp_path / "x.npy")!r}, '-o', {str(tmp_path / "m.npz")!r}, '-q']) == 0
    sys.exit(main(['fit', {str(tmp_path / "x.npy")!r}, '-o', {str(tmp_path / "d.npz")!r}, '--engine', 'dask']))
# the missing extra first, before the output is checked (its folder is missing too) or a code trained
out = {str(tmp_path / "nowhere" / "y.zarr")!r}
sys.exit(main(['apply', {str(tmp_path / "m.npz")!r}, {str(tmp_path / "x.npy")!r}, '-o', out, '--engine', 'dask',
               '--dtype', 'eigen:2']))
"""
    for command in ("fit", "apply"):
        done = subprocess.run(
            [sys.executable, "-c", code, command], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert "pip install 'streamwhiten[dask]'" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "m.npz").exists() and not (tmp_path / "d.npz").exists()


# ----------------------------------------------------------------------------------- dask arrays


@pytest.mark.parametrize(
    "chunks",
    [(1000, 12), (3333, 12), ((1, 999, 2500, 1500), (12,)), (1000, 5)],
    ids=["1000", "3333", "uneven", "split-columns"],
)
def test_dask_moments_match_references(client, data64, chunks):
    array = da.from_array(data64, chunks=chunks)
    state = sd.fit_dask_array(array, client=client).state
    mean, scatter = two_pass(data64)
    assert_moments_close(state, mean, scatter, data64.shape[0])
    serial = Whitener().fit(data64).state_  # the single-process engine on the same rows
    assert_moments_close(state, serial.mean, serial.scatter, serial.n_rows)


def test_dask_moments_do_not_depend_on_workers_or_scheduling(client, data64):
    """The merge tree is fixed by the block layout, so 2 processes, 1 thread and 2 threads agree bit for bit."""
    array = da.from_array(data64, chunks=(700, 12))
    on_cluster = sd.fit_dask_array(array, client=client).state
    with threadpool_limits(1):
        for scheduler in ("synchronous", "threads"):
            with dask.config.set(scheduler=scheduler):
                assert sd.fit_dask_array(array).state == on_cluster
    # Another tree shape may round differently, but stays within the bound.
    assert_moments_close(
        sd.fit_dask_array(array, client=client, split_every=2).state,
        on_cluster.mean,
        on_cluster.scatter,
        on_cluster.n_rows,
    )


def test_dask_array_input_checks(data64):
    with pytest.raises(BadInputError, match="2-D"):
        sd.fit_dask_array(da.ones(10, chunks=5))
    with pytest.raises(BadInputError, match="unknown chunk sizes"):
        array = da.from_array(data64, chunks=(1000, 12))
        sd.fit_dask_array(array[array[:, 0] > 0])
    ints = da.from_array(np.arange(40).reshape(10, 4), chunks=(3, 4))
    with pytest.raises(
        BadInputError,
        match=r"expected float16, float32 or float64 values, got dtype int64 "
        r"\(convert with \.astype\(np\.float32\)\)",
    ):
        sd.fit_dask_array(ints)  # floats only, as for in-memory arrays and stores
    swapped = da.from_array(np.arange(40.0).reshape(10, 4).astype(">f8"), chunks=(3, 4))
    mean, scatter = two_pass(np.arange(40.0).reshape(10, 4))
    with dask.config.set(scheduler="synchronous"):
        assert_moments_close(sd.fit_dask_array(swapped).state, mean, scatter, 10)


def test_whitener_fits_and_transforms_dask_arrays(client, data64):
    array = da.from_array(data64, chunks=(1200, 12))
    with dask.config.set(scheduler=client.get):
        fitted = Whitener(n_components=5).fit(array)
        lazy = fitted.transform(array, normalize=True)
        assert isinstance(lazy, da.Array) and lazy.shape == (5_000, 5)
        out = lazy.compute()
    reference = Whitener(n_components=5).fit(data64)
    assert rel(fitted.eigvals_, reference.eigvals_) <= TOL
    assert rel(fitted.mean_, reference.mean_) <= TOL
    np.testing.assert_allclose(out, reference.transform(data64, normalize=True), rtol=1e-9, atol=1e-12)


def test_whitener_dask_nonfinite(client, data64):
    rows = data64.copy()
    rows[[10, 4321]] = np.nan
    array = da.from_array(rows, chunks=(1000, 12))
    with dask.config.set(scheduler=client.get):
        with pytest.raises(NonFiniteError, match="dask array: row (10|4321) holds NaN or Inf"):
            Whitener().fit(array)
        fitted = Whitener(skip_nonfinite=True).fit(array)
    assert fitted.n_skipped_ == 2
    mean, scatter = two_pass(np.delete(rows, [10, 4321], axis=0))
    assert_moments_close(fitted.state_, mean, scatter, 4_998)


def test_whitener_dask_transform_names_nonfinite_rows_and_refuses_ints(client, data64):
    rows = data64.copy()
    rows[[2500, 4321]] = np.nan
    fitted = Whitener(n_components=5).fit(data64)
    lazy = fitted.transform(da.from_array(rows, chunks=(1000, 12)))
    with dask.config.set(scheduler=client.get):
        with pytest.raises(NonFiniteError, match=r"^row (2500|4321) holds NaN or Inf \(use skip_nonfinite=True"):
            lazy.compute()  # the row in the whole array, not in its block
        out = fitted.set_params(skip_nonfinite=True).transform(da.from_array(rows, chunks=(1000, 12))).compute()
    assert np.isnan(out[[2500, 4321]]).all()
    keep = np.delete(np.arange(5_000), [2500, 4321])
    np.testing.assert_allclose(out[keep], fitted.transform(data64)[keep], rtol=1e-12, atol=1e-12)
    ints = da.from_array(np.arange(120).reshape(10, 12), chunks=(5, 12))
    for call in (Whitener().fit, fitted.transform):
        with pytest.raises(BadInputError, match="expected float16, float32 or float64 values, got dtype int64"):
            call(ints)
    swapped = da.from_array(data64.astype(">f8"), chunks=(1000, 12))
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_allclose(
            fitted.transform(swapped).compute(), fitted.transform(data64), rtol=1e-12, atol=1e-12
        )


# ---------------------------------------------------------------------------------------- stores


@pytest.mark.parametrize("block_rows", [1000, 3333])
def test_fit_dask_on_stores_matches_serial_engine(client, stores, block_rows):
    specs = [stores.h5, stores.zarr]
    result = sd.fit_dask(specs, cluster=DaskEngine(client=client), read=ReadOptions(block_rows=block_rows))
    serial = serial_one_thread(specs, block_rows=block_rows)
    assert_moments_close(result.state, serial.state.mean, serial.state.scatter, 17_000)
    assert result.sources == serial.sources
    assert result.n_blocks == serial.n_blocks and result.n_skipped == 0
    rows = np.concatenate([generate_rows(10_000, 24, 0), generate_rows(7_000, 24, 1)])
    mean, scatter = two_pass(rows)
    assert_moments_close(result.state, mean, scatter, 17_000, tol=1e-6)  # float32 products: ~1e-7


def test_fit_dask_float64_any_layout(client, stores):
    """Float64 arithmetic: the serial engine at one block size, Dask at another, within 1e-12."""
    serial = fit_sources([stores.h5, stores.zarr], precision="float64", block_rows=1000)
    for block_rows in (777, 3333):
        result = sd.fit_dask(
            [stores.h5, stores.zarr],
            precision="float64",
            cluster=DaskEngine(client=client),
            read=ReadOptions(block_rows=block_rows),
        )
        assert_moments_close(result.state, serial.state.mean, serial.state.scatter, 17_000)


def test_fit_dask_nonfinite_rows(client, stores):
    # Blocks run in parallel and the first failure stops the fit: it names one of the two bad rows.
    with pytest.raises(NonFiniteError, match=r"nan.h5:/embeddings: row (1234|5678) holds NaN or Inf") as caught:
        sd.fit_dask(stores.nan, cluster=DaskEngine(client=client), read=ReadOptions(block_rows=1000))
    assert f"row {caught.value.row} " in str(caught.value)
    result = sd.fit_dask(
        stores.nan, cluster=DaskEngine(client=client), skip_nonfinite=True, read=ReadOptions(block_rows=1000)
    )
    serial = serial_one_thread(stores.nan, block_rows=1000, skip_nonfinite=True)
    assert result.n_skipped == serial.n_skipped == 2
    assert_moments_close(result.state, serial.state.mean, serial.state.scatter, 5_998)


def test_fit_dask_bad_inputs(client, stores, tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        sd.fit_dask(str(tmp_path / "missing.h5"), cluster=DaskEngine(client=client))
    narrow = write_store(str(tmp_path / "narrow.h5"), 100, 8)
    with pytest.raises(BadInputError, match="columns"):
        sd.fit_dask([stores.h5, narrow], cluster=DaskEngine(client=client))
    with pytest.raises(BadInputError, match="precision"):
        sd.fit_dask(stores.h5, precision="float16", cluster=DaskEngine(client=client))


def test_lazy_rows_reopen_and_notice_a_changed_store(tmp_path):
    import pickle

    spec = write_store(str(tmp_path / "c.h5"), 300, 6, chunk_rows=100)
    with open_source(spec) as source:
        lazy = pickle.loads(pickle.dumps(lazy_rows(source)))
        np.testing.assert_array_equal(lazy[10:20, 0:6], source.read(10, 20))
    write_store(str(tmp_path / "c.h5"), 200, 6, chunk_rows=100)
    with pytest.raises(StoreIOError, match="changed while being read"):
        lazy[0:10]


# ----------------------------------------------------------------------------------------- apply


@pytest.fixture(scope="module")
def model(stores):
    return finalize(fit_sources([stores.h5, stores.zarr]).state, n_components=10)


def test_apply_dask_matches_serial_applier(client, stores, model, tmp_path):
    out, ref = str(tmp_path / "out.zarr"), str(tmp_path / "ref.zarr")
    done = []
    summary = sd.apply_dask(
        model,
        stores.h5,
        out,
        ApplyOptions(normalize=True),
        ReadOptions(block_rows=2000),
        cluster=DaskEngine(client=client),
        output_chunk_rows=1000,
        watch=Watch(lambda rows, total: done.append((rows, total))),
    )
    apply_model(model, stores.h5, ref, ApplyOptions(normalize=True))
    np.testing.assert_allclose(read_all(out), read_all(ref), rtol=1e-5, atol=1e-6)
    assert read_attrs(out) == read_attrs(ref)
    assert read_attrs(out)["complete"] is True
    assert summary.n_rows == 10_000 and summary.n_nonfinite_rows == 0
    assert done[-1] == (10_000, 10_000) and len(done) == 5
    assert not os.path.exists(partial_path(out))


@pytest.mark.parametrize("dtype", ["int8", "binary"])
def test_apply_dask_writes_the_codes_and_record_of_the_serial_applier(client, stores, model, tmp_path, dtype):
    import zarr

    out, ref = str(tmp_path / "out.zarr"), str(tmp_path / "ref.zarr")
    summary = sd.apply_dask(
        model, stores.h5, out, ApplyOptions(dtype=dtype), ReadOptions(block_rows=2000), cluster=DaskEngine(client=client),
        output_chunk_rows=1000,
    )  # fmt: skip
    apply_model(model, stores.h5, ref, ApplyOptions(dtype=dtype))
    codes, expected = zarr.open_array(out, mode="r")[...], zarr.open_array(ref, mode="r")[...]
    assert codes.dtype == expected.dtype == (np.int8 if dtype == "int8" else np.uint8)
    assert codes.shape == (10_000, 10 if dtype == "int8" else 2)
    # the transform runs in other processes (BLAS rounding may differ): a code may sit one step off
    assert np.abs(codes.astype(np.int16) - expected).max() <= (1 if dtype == "int8" else 255)
    if dtype == "binary":
        assert np.mean(np.unpackbits(codes, axis=1) != np.unpackbits(expected, axis=1)) < 1e-4
    else:
        assert np.mean(codes != expected) < 1e-3
    assert read_attrs(out)["quantization"] == read_attrs(ref)["quantization"] == model.quantization(dtype).to_dict()
    assert (summary.dtype, summary.normalized) == (dtype, True)


def test_apply_dask_with_no_dtype_writes_the_models_storage_as_the_serial_applier(client, stores, model, tmp_path):
    """dtype None is the model's storage (float32 without one), not numpy's default float64."""
    from dataclasses import replace

    import zarr

    from streamwhiten.storage import Storage

    for name, fitted, written in (
        ("plain", model, np.float32),
        ("coded", replace(model, storage=Storage("int8")), np.int8),
    ):
        out = str(tmp_path / f"{name}.zarr")
        sd.apply_dask(
            fitted, stores.h5, out, ApplyOptions(dtype=None), cluster=DaskEngine(client=client), output_chunk_rows=1000
        )
        assert zarr.open_array(out, mode="r").dtype == written


def test_apply_dask_skip_nonfinite_writes_nan_rows(client, stores, model, tmp_path):
    out = str(tmp_path / "nan.zarr")
    summary = sd.apply_dask(
        model,
        stores.nan,
        out,
        ApplyOptions(skip_nonfinite=True),
        ReadOptions(block_rows=1000),
        cluster=DaskEngine(client=client),
        output_chunk_rows=1000,
    )
    rows = read_all(out)
    assert summary.n_nonfinite_rows == 2 and read_attrs(out)["n_nonfinite_rows"] == 2
    assert np.isnan(rows[[1234, 5678]]).all() and np.isfinite(np.delete(rows, [1234, 5678], axis=0)).all()


def test_apply_dask_failure_leaves_old_output_and_no_partial(client, stores, model, tmp_path):
    out = str(tmp_path / "kept.zarr")
    sd.apply_dask(model, stores.h5, out, cluster=DaskEngine(client=client))
    before = read_all(out)
    for overwrite in (False, True):  # up to date: kept, overwrite or not (exit 3), as the serial engine does
        with pytest.raises(NothingToDoError, match="is up to date"):
            sd.apply_dask(model, stores.h5, out, ApplyOptions(overwrite=overwrite), cluster=DaskEngine(client=client))
    with pytest.raises(OutputExistsError):  # another setting: replaced only with overwrite
        sd.apply_dask(model, stores.h5, out, ApplyOptions(normalize=True), cluster=DaskEngine(client=client))
    with pytest.raises(NonFiniteError, match="nan.h5:/embeddings: row (1234|5678)"):
        sd.apply_dask(
            model,
            stores.nan,
            out,
            ApplyOptions(overwrite=True),
            ReadOptions(block_rows=500),
            cluster=DaskEngine(client=client),
            output_chunk_rows=500,
        )
    np.testing.assert_array_equal(read_all(out), before)
    assert not os.path.exists(partial_path(out))
    fresh = str(tmp_path / "fresh.zarr")
    with pytest.raises(NonFiniteError):
        sd.apply_dask(
            model,
            stores.nan,
            fresh,
            ApplyOptions(),
            ReadOptions(block_rows=500),
            cluster=DaskEngine(client=client),
            output_chunk_rows=500,
        )
    assert not os.path.exists(fresh) and not os.path.exists(partial_path(fresh))


def test_apply_dask_finds_an_up_to_date_output_without_reaching_a_cluster(client, stores, model, tmp_path, monkeypatch):
    # a job's apply (engine = "dask") skips a current output by apply's NothingToDoError: no cluster is
    # started or reached for it, so a night with nothing to write does not depend on the scheduler
    out = str(tmp_path / "current.zarr")
    sd.apply_dask(model, stores.h5, out, cluster=DaskEngine(client=client))
    monkeypatch.setattr(sd, "CONNECT_TIMEOUT", 1)
    with pytest.raises(NothingToDoError, match="is up to date"):
        sd.apply_dask(
            model, stores.h5, out, ApplyOptions(overwrite=True), cluster=DaskEngine(scheduler="tcp://127.0.0.1:1")
        )
    with pytest.raises(ClusterError, match="cannot reach the Dask scheduler"):  # one to write still needs it
        sd.apply_dask(model, stores.h5, str(tmp_path / "new.zarr"), cluster=DaskEngine(scheduler="tcp://127.0.0.1:1"))


def test_apply_dask_takes_apply_model_options_alike():
    """apply_dask is apply_model on a cluster: the options they share travel as the same two objects
    (ApplyOptions, ReadOptions: normalize, dtype, overwrite, skip_nonfinite, zarr_format, dataset,
    block_rows, fill_missing_chunks, ...), in the same places with the same defaults, so the two
    signatures cannot drift apart."""
    import inspect

    serial = inspect.signature(apply_model).parameters
    dask_engine = inspect.signature(sd.apply_dask).parameters
    shared = [name for name in serial if name in dask_engine]
    assert shared == [name for name in dask_engine if name in serial]
    assert shared[:5] == ["model", "input_spec", "output_spec", "options", "read"]
    assert "watch" in shared
    assert [(name, dask_engine[name].default) for name in shared] == [(name, serial[name].default) for name in shared]
    fields = {f.name for f in dataclasses.fields(ApplyOptions)} | {f.name for f in dataclasses.fields(ReadOptions)}
    assert {"dataset", "normalize", "dtype", "block_rows", "overwrite", "skip_nonfinite", "zarr_format"} <= fields
    assert "fill_missing_chunks" in fields


def test_apply_dask_refuses_hdf5_output(client, stores, model, tmp_path):
    with pytest.raises(BadInputError, match="writes Zarr only"):
        sd.apply_dask(model, stores.h5, str(tmp_path / "out.h5"), cluster=DaskEngine(client=client))
    assert os.listdir(tmp_path) == []


def test_region_writer_refuses_unaligned_rows(tmp_path):
    from streamwhiten.io import open_output

    with open_output(str(tmp_path / "w.zarr")).create(OutputPlan(100, 3, chunk_rows=10)) as sink:
        writer = sink.region_writer()
        writer(90, np.ones((10, 3), np.float32))
        with pytest.raises(BadInputError, match="not aligned"):
            writer(5, np.ones((10, 3), np.float32))
        sink.abort()


# ------------------------------------------------------------------------------- cluster failures


def test_killed_worker_becomes_a_cluster_error():
    with pytest.raises(ClusterError, match="running task 'block-1' died 4 time.*tcp://10.0.0.1:1234"):
        with sd._cluster_errors("the fit"):
            raise distributed.KilledWorker("block-1", SimpleNamespace(address="tcp://10.0.0.1:1234"), 3)


def test_unreachable_scheduler_is_a_cluster_error(stores, monkeypatch):
    monkeypatch.setattr(sd, "CONNECT_TIMEOUT", 1)
    with pytest.raises(ClusterError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:1"):
        sd.fit_dask(stores.h5, cluster=DaskEngine(scheduler="tcp://127.0.0.1:1"))


@pytest.mark.slow
@pytest.mark.parametrize("retries", [3, 0], ids=["dask-default-retries", "no-retries"])
def test_worker_killed_mid_fit_gives_the_right_model_or_a_clear_error(data64, retries):
    """SIGKILL one of two worker processes while the fit runs: dask reruns its lost tasks on the other
    worker (up to ``allowed-failures`` times); with no retries allowed the fit must fail clearly."""

    def slow(block):  # a local function travels to the workers by value
        time.sleep(0.1)
        return block

    array = da.from_array(data64, chunks=(125, 12)).map_blocks(slow, dtype=data64.dtype)  # 40 blocks
    mean, scatter = two_pass(data64)
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": retries}),
        sd.dask_client(n_workers=2) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        running = pool.submit(sd.fit_dask_array, array, client=client)
        deadline = time.monotonic() + 20
        while not any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert not running.done()
        victim = sorted(client.run(os.getpid).values())[0]
        os.kill(victim, signal.SIGKILL)
        try:
            result = running.result(timeout=60)
        except ClusterError as exc:  # a clear error is acceptable; a wrong model is not
            assert "the fit was abandoned: workers running task" in str(exc)
            print(f"outcome with {retries} retries: {exc}")
            return
    assert retries > 0, "a worker died while running a task, yet the fit without retries returned"
    print(f"outcome with {retries} retries: correct statistics after the kill, {result.n_blocks} blocks")
    assert result.n_skipped == 0
    assert_moments_close(result.state, mean, scatter, data64.shape[0])


# ------------------------------------------------------------------------------------------- CLI


def test_cli_fit_and_apply_with_dask(client, stores, tmp_path, capsys):
    address = client.scheduler.address
    serial, dask_model = str(tmp_path / "serial.npz"), str(tmp_path / "dask.npz")
    common = [stores.h5, stores.zarr, "--precision", "float64", "-k", "6", "-q"]
    assert main(["fit", *common, "-o", serial, "--chunk-rows", "1000"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "fit",
                *common,
                "-o",
                dask_model,
                "--chunk-rows",
                "3333",
                "--engine",
                "dask",
                "--scheduler",
                address,
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["engine"] == "dask" and summary["n_rows"] == 17_000
    a, b = load_model(serial), load_model(dask_model)
    assert_moments_close(b.state, a.state.mean, a.state.scatter, a.n_rows)
    assert rel(b.eigvals, a.eigvals) <= TOL and b.sources == a.sources

    out = str(tmp_path / "white.zarr")
    assert main(["apply", dask_model, stores.h5, "-o", out, "--engine", "dask", "--scheduler", address, "-q"]) == 0
    np.testing.assert_allclose(
        read_all(out), load_model(dask_model).transform(read_all(stores.h5)), rtol=1e-5, atol=1e-5
    )


def test_cli_dask_local_cluster_and_errors(stores, tmp_path, capsys):
    model_path = str(tmp_path / "m.npz")
    assert main(["fit", stores.h5, "-o", model_path, "--engine", "dask", "--workers", "1", "-q"]) == 0
    capsys.readouterr()
    assert (
        main(["apply", model_path, stores.h5, "-o", str(tmp_path / "o.h5"), "--engine", "dask", "--workers", "1"]) == 2
    )
    assert main(["fit", stores.h5, "-o", str(tmp_path / "x.npz"), "--workers", "2"]) == 2
    assert (
        main(
            [
                "fit",
                stores.h5,
                "-o",
                str(tmp_path / "x.npz"),
                "--engine",
                "dask",
                "--workers",
                "2",
                "--scheduler",
                "tcp://127.0.0.1:1",
            ]
        )
        == 2
    )
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("streamwhiten: error: ") for line in errors)
    assert "o.h5: the dask engine writes Zarr only" in errors[0]
    assert sorted(os.listdir(tmp_path)) == ["m.npz"]


# ------------------------------------------------------------------------------------- benchmark


@pytest.mark.slow
def test_benchmark_quick_runs(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "dask_scaling.py"),
            "--quick",
            "--precision",
            "float64",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    engines = {run["engine"] for run in report["runs"]}
    assert engines == {"serial", "dask 1 process", "dask 2 processes", "dask 2 threads"}
    assert all(run["rows_per_second"] > 0 for run in report["runs"])
    assert all(run["max_rel_diff_vs_serial"] <= TOL for run in report["runs"])
    assert "rows/s" in done.stdout


def test_serial_and_dask_reduce_the_same_blocks_of_mixed_sources_without_block_rows(stores, monkeypatch):
    """One block plan for every engine: with sources of different natural blocks (HDF5 chunks of 1000
    rows, Zarr chunks of 512) and no block_rows, both engines cut every source at the same rows and
    reduce each block to the same bits; only the order of the final float64 merges differs."""
    import streamwhiten.engine.fit as fit_module
    from streamwhiten.io._store import StoreSource

    natural = StoreSource.default_block_rows
    # ~64 KiB blocks instead of ~64 MiB, so these small stores have several blocks, of different sizes
    monkeypatch.setattr(
        StoreSource, "default_block_rows", lambda self, target_bytes=64 << 10: natural(self, target_bytes)
    )
    with open_source(stores.h5) as h5, open_source(stores.zarr) as zr:
        assert (h5.default_block_rows(), zr.default_block_rows()) == (1000, 512)

    def recording(module, into):
        real = module.reduce_block

        def reduce(rows, begin, label, *args, **kwargs):
            moments, skipped = real(rows, begin, label, *args, **kwargs)
            into.append(((label, begin, begin + rows.shape[0]), moments))
            return moments, skipped

        monkeypatch.setattr(module, "reduce_block", reduce)

    serial_blocks, dask_blocks = [], []
    recording(fit_module, serial_blocks)
    recording(sd, dask_blocks)
    specs = [stores.h5, stores.zarr]
    with threadpool_limits(1):
        serial = fit_sources(specs, precision="float64", threads=1)
        with sd.dask_client(n_workers=1, processes=False) as in_process:  # the patches apply to its tasks
            result = sd.fit_dask(specs, precision="float64", cluster=DaskEngine(client=in_process))
    zarr_label = open_source(stores.zarr).label
    expected = [(zarr_label, b, min(b + 1000, 7000)) for b in range(0, 7000, 1000)]
    assert [key for key, _ in serial_blocks if key[0] == zarr_label] == expected  # the largest natural block
    assert sorted(key for key, _ in dask_blocks) == sorted(key for key, _ in serial_blocks)
    assert len(serial_blocks) == 17 == result.n_blocks == serial.n_blocks
    reduced = dict(serial_blocks)
    for key, moments in dask_blocks:
        assert moments == reduced[key], key  # bit for bit
    assert_moments_close(result.state, serial.state.mean, serial.state.scatter, 17_000)


def test_fit_is_the_one_entry_point_of_both_engines(client, stores, tmp_path):
    import streamwhiten
    from streamwhiten.engine.engines import DaskEngine
    from streamwhiten.errors import NothingToDoError
    from streamwhiten.options import FitOptions, Setting

    specs = [stores.h5, stores.zarr]
    setting, options = Setting(n_components=10, beta=0.5), FitOptions(precision="float64")
    serial = streamwhiten.fit(specs, str(tmp_path / "s.npz"), setting=setting, options=options)
    dask = streamwhiten.fit(
        specs, str(tmp_path / "d.npz"), setting=setting, options=options, engine=DaskEngine(client=client)
    )
    assert not dask.resumed and dask.engine == "dask" and dask.n_blocks == serial.n_blocks
    assert (
        dask.model.info
        == serial.model.info
        == {"n_skipped_nonfinite": 0, "precision": "float64", "skip_nonfinite": False, "fill_missing_chunks": False}
    )
    assert dask.model.sources == serial.model.sources and dask.model.n_components == 10 and dask.model.beta == 0.5
    assert_moments_close(dask.model.state, serial.model.state.mean, serial.model.state.scatter, 17_000)
    for engine in (None, DaskEngine(client=client)):  # an existing model: nothing to do when current, else refused
        with pytest.raises(NothingToDoError):
            streamwhiten.fit(specs, str(tmp_path / "d.npz"), setting=setting, options=options, engine=engine)
        with pytest.raises(OutputExistsError, match=r"d.npz: already exists \(pass overwrite=True to replace it\)"):
            streamwhiten.fit(
                specs, str(tmp_path / "d.npz"), setting=Setting(n_components=9), options=options, engine=engine
            )
    with pytest.raises(BadInputError, match="serial engine only"):
        streamwhiten.fit(specs, update=str(tmp_path / "d.npz"), engine=DaskEngine(client=client))
