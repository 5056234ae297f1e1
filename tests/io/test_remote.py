"""Stores on object storage, against a real S3-compatible server (moto's server mode on 127.0.0.1, started by
the ``s3_server`` fixture in conftest): fit, apply, --update, run and Dask from s3:// equal the same work on a
local copy; kill -9 resumes bit for bit; incomplete outputs are never taken for complete ones; transient
failures are retried (through a proxy that drops connections) and lasting ones are one line, exit 74;
credentials never reach a file or a message."""

from __future__ import annotations

import builtins
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO, S3_SECRET, anisotropic, s3fs_client, start_moto, write_zarr

from streamwhiten.engine.engines import DaskEngine
from streamwhiten.errors import EXIT_BAD_INPUT, EXIT_IO, EXIT_NOTHING_TO_DO
from streamwhiten.io import open_source, read_attrs, remote, split_spec
from streamwhiten.io.output import output_exists
from streamwhiten.options import ApplyOptions, ReadOptions
from tests.engine.test_resume import kill_when, rerun_code

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def upload(endpoint, local, url):
    fs = s3fs_client(endpoint)
    key = url[len("s3://") :]
    if os.path.isdir(local):
        fs.put(str(local), key, recursive=True)
    else:
        fs.put_file(str(local), key)
    return url


def statistics(path):
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key].tobytes() for key in ("n_rows", "mean", "scatter", "eigvals", "eigvecs")}


def write_parquet(path, data, row_group_rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), data.shape[1])
    table = pa.table({"id": np.arange(data.shape[0]), "embedding": column})
    pq.write_table(table, path, row_group_size=row_group_rows)
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    return anisotropic(3000, 16, seed=7).astype(np.float32)


# --------------------------------------------------------------------------------------- units


def test_url_specs_are_parsed_compared_and_redacted():
    from streamwhiten.io.spec import partial_path, same_file

    assert split_spec("s3://b/x.h5:/emb") == ("s3://b/x.h5", "emb")
    assert split_spec("s3://b/corpus.zarr") == ("s3://b/corpus.zarr", None)
    assert split_spec("s3://b/t.parquet:embedding") == ("s3://b/t.parquet", "embedding")
    assert split_spec("file:///tmp/x.zarr") == ("/tmp/x.zarr", None)
    assert partial_path("s3://b/out/w.zarr") == "s3://b/out/.w.zarr.partial"
    assert same_file("s3://b/a.zarr", "s3a://b//a.zarr/") and same_file("s3://b/a.zarr/x", "s3://b/a.zarr")
    assert not same_file("s3://b/a.zarr", "s3://b/a.zarr2") and not same_file("s3://b/a.zarr", "/b/a.zarr")
    assert remote.normalize("s3://b/./x/../y.zarr/") == "s3://b/y.zarr"
    assert remote.redact("https://me:pw@host/x.npy?X-Amz-Signature=abc") == "https://host/x.npy"
    from streamwhiten.errors import BadInputError

    with pytest.raises(BadInputError, match="holds credentials") as info:
        remote.check_url("https://me:hunter22@host/x.npy")
    assert "hunter22" not in str(info.value)
    with pytest.raises(BadInputError, match="signed"):
        remote.check_url("https://host/x.npy?X-Amz-Signature=abc&X-Amz-Credential=k")
    assert remote.options_from(["anon=false", "client_kwargs.region_name=eu-west-1", "retries=3"]) == {
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1"},
        "retries": 3,
    }


def test_transient_failures_are_retried_and_lasting_ones_are_one_store_io_error(monkeypatch):
    from streamwhiten.errors import BadInputError, StoreIOError

    monkeypatch.setattr(remote, "BACKOFF", 0.001)
    deadline = ReadOptions(remote_timeout=0.3)  # the deadline, for this test only
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return "ok"

    assert remote.retrying("s3://b/x", "read", flaky, read=deadline) == "ok" and len(calls) == 3

    def throttled():
        raise OSError("An error occurred (SlowDown) when calling the GetObject operation: please reduce rate")

    began = time.monotonic()
    with pytest.raises(
        StoreIOError, match=r"s3://b/x: cannot read after \d+ attempts in 0 s \(remote_timeout=0.3\): .*SlowDown"
    ):
        remote.retrying("s3://b/x", "read", throttled, read=deadline)
    assert 0.3 <= time.monotonic() - began < 1.0  # the deadline, not a count of attempts
    with pytest.raises(BadInputError, match="no such object"):
        remote.retrying("s3://b/x", "read", lambda: (_ for _ in ()).throw(FileNotFoundError("b/x")), read=deadline)
    with pytest.raises(StoreIOError, match="access denied"):
        remote.retrying(
            "s3://b/x", "read", lambda: (_ for _ in ()).throw(PermissionError("InvalidAccessKeyId")), read=deadline
        )


def test_a_timeout_that_is_no_builtin_timeout_error_is_transient():
    """urllib3's TimeoutError, and asyncio's or concurrent.futures' on Python 3.10, derive from Exception, not
    the built-in TimeoutError, and often say nothing: known by their class name, they are retried."""
    urllib3 = pytest.importorskip("urllib3")

    class TimeoutError(Exception):  # noqa: A001 - asyncio.TimeoutError as Python 3.10 defines it
        pass

    for timeout in (urllib3.exceptions.TimeoutError(), TimeoutError()):
        assert not isinstance(timeout, builtins.TimeoutError) and str(timeout) == ""
        assert remote.classify(timeout) == "transient"
    assert remote.classify(RuntimeError("the object is not a store")) == "other"


def test_an_hdf5_object_that_cannot_be_reached_is_an_io_error_not_a_file_that_is_no_hdf5(monkeypatch):
    """Opening a remote HDF5 file through a store that stopped answering gives up after remote_timeout with
    the StoreIOError every backend raises (exit 74); it was taken for a file HDF5 cannot open (exit 2)."""
    pytest.importorskip("s3fs")
    from streamwhiten.errors import StoreIOError
    from streamwhiten.io.hdf5 import HDF5Source

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sw-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sw-test-secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    read = ReadOptions(remote_timeout=0.5, storage_options={"endpoint_url": f"http://127.0.0.1:{port}"})
    with pytest.raises(StoreIOError, match=r"^s3://b/x\.h5: cannot open .*\(remote_timeout=0\.5\)"):
        HDF5Source("s3://b/x.h5", None, read)


# ------------------------------------------------------------------------- storage options, no global


def test_messages_hide_the_secrets_of_every_set_of_options_used():
    """``scrub`` reads no global: the secret values of options are remembered (values only) as a file
    system is made with them, and hidden from every message after, whichever options are in use."""
    pytest.importorskip("s3fs")
    import uuid

    fresh = f"sw-{uuid.uuid4().hex}"
    assert remote.scrub(f"said {fresh}") == f"said {fresh}"  # never used: nothing to hide
    options = ReadOptions(storage_options={"key": "id", "secret": fresh, "client_kwargs": {"region_name": "x"}})
    remote.filesystem("s3://bucket/x.zarr", options)  # made, not contacted
    assert remote.scrub(f"said {fresh} twice {fresh}") == "said *** twice ***"
    assert fresh not in repr(options) and fresh not in repr(remote.filesystem("s3://bucket/y", ReadOptions()))


def test_storage_options_travel_with_each_call_and_threads_with_other_options_do_not_mix(
    tmp_path, s3_bucket, s3_server, corpus, monkeypatch
):
    """No process-wide setting: the endpoint of the environment is wrong, two threads read the same URL at
    once, one with the right endpoint as a storage option (it reads the rows), one without (it fails
    within its own deadline); file systems are kept per protocol *and* options."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import _free_port

    from streamwhiten.errors import StoreIOError

    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", corpus, chunk_rows=250), f"{s3_bucket}/c.zarr")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # nobody listens there
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    remote.clear_cache()
    right = ReadOptions(storage_options={"endpoint_url": s3_server}, remote_timeout=5)
    wrong = ReadOptions(remote_timeout=1)

    def read(options):
        with open_source(url, read=options) as source:
            return source.read(0, len(corpus))

    with ThreadPoolExecutor(2) as pool:
        good, bad = pool.submit(read, right), pool.submit(read, wrong)
        np.testing.assert_array_equal(good.result(), corpus)
        with pytest.raises(StoreIOError, match=r"remote_timeout=1\b"):
            bad.result()
    assert remote.filesystem(url, right)[0] is remote.filesystem(url, ReadOptions(**vars(right)))[0]
    assert remote.filesystem(url, right)[0] is not remote.filesystem(url, wrong)[0]


def test_the_estimator_takes_storage_options_and_never_shows_their_values(
    tmp_path, s3_bucket, s3_server, corpus, monkeypatch
):
    from conftest import _free_port

    from streamwhiten import Whitener
    from streamwhiten.errors import BadInputError

    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", corpus, chunk_rows=250), f"{s3_bucket}/c.zarr")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")  # the environment's is wrong
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0000")
    remote.clear_cache()
    options = {"endpoint_url": s3_server, "key": "sw-test-key", "secret": S3_SECRET}
    fitted = Whitener(n_components=4, read=ReadOptions(storage_options=options)).fit(url)
    local = Whitener(n_components=4).fit(str(tmp_path / "c.zarr"))
    np.testing.assert_array_equal(fitted.model_.state.scatter, local.model_.state.scatter)
    assert fitted.sources_[0].path == url
    shown = [repr(fitted), fitted._repr_html_(), str(fitted._repr_mimebundle_())]
    assert all(S3_SECRET not in text for text in shown) and "secret" in shown[0]
    assert S3_SECRET not in remote.scrub(f"a message quoting {S3_SECRET}")  # the secrets of options used
    with pytest.raises(BadInputError, match="^storage_options must be a mapping"):
        Whitener(read=ReadOptions(storage_options=["endpoint_url=x"])).fit(url)


# --------------------------------------------------------------------------------- fit and apply


@pytest.mark.parametrize("kind", ["zarr", "npy", "parquet"])
def test_fit_from_s3_equals_the_fit_of_a_local_copy(tmp_path, s3_bucket, s3_server, corpus, run_cli, kind):
    if kind == "zarr":
        local = write_zarr(tmp_path / "c.zarr", corpus, chunk_rows=250)
    elif kind == "npy":
        local = str(tmp_path / "c.npy")
        np.save(local, corpus)
    else:
        pytest.importorskip("pyarrow")
        local = write_parquet(tmp_path / "c.parquet", corpus, 500)
    url = upload(s3_server, local, f"{s3_bucket}/{os.path.basename(local)}")
    common = ["--chunk-rows", "500", "--threads", "2", "-q"]
    assert run_cli("fit", local, "-o", tmp_path / "local.npz", *common)[0] == 0
    code, out, err = run_cli("fit", url, "-o", tmp_path / "remote.npz", *common)
    assert code == 0, err
    assert statistics(tmp_path / "remote.npz") == statistics(tmp_path / "local.npz")
    from streamwhiten.core.model import load_model

    model = load_model(tmp_path / "remote.npz")
    assert model.sources[0].path == url and model.sources[0].etag and model.sources[0].size > 0
    # the default (several reads in flight) against the float64 statistics of numpy
    assert run_cli("fit", url, "-o", tmp_path / "default.npz", "-q")[0] == 0
    default = load_model(tmp_path / "default.npz")
    x = corpus.astype(np.float64)
    np.testing.assert_allclose(default.state.mean, x.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(default.state.scatter / len(x), np.cov(x.T, bias=True), rtol=1e-5, atol=1e-6)
    # unchanged inputs: nothing to do; the fingerprint holds the object's ETag and size
    assert run_cli("fit", url, "-o", tmp_path / "default.npz", "-q")[0] == EXIT_NOTHING_TO_DO


def test_apply_from_and_to_s3_equals_apply_of_a_local_copy(tmp_path, s3_bucket, s3_server, corpus, run_cli):
    pytest.importorskip("pyarrow")
    local = write_parquet(tmp_path / "c.parquet", corpus, 500)
    url = upload(s3_server, local, f"{s3_bucket}/in/c.parquet")
    assert run_cli("fit", local, "-o", tmp_path / "m.npz", "-q", "--chunk-rows", "500")[0] == 0
    common = ["-k", "8", "--normalize", "-q", "--threads", "1", "--checkpoint-seconds", "0"]
    assert run_cli("apply", tmp_path / "m.npz", local, "-o", tmp_path / "w.zarr", *common)[0] == 0
    expected = open_source(str(tmp_path / "w.zarr")).read(0, len(corpus))
    for out in (f"{s3_bucket}/out/w.zarr", f"{s3_bucket}/out/w.parquet"):
        code, _, err = run_cli(
            "apply",
            tmp_path / "m.npz",
            url,
            "-o",
            out,
            *common,
            *(["--keep-columns", "id"] if out.endswith("parquet") else []),
        )
        assert code == 0, err
        with open_source(out) as written:
            np.testing.assert_array_equal(written.read(0, len(corpus)), expected)
        attrs = read_attrs(out)
        assert attrs["complete"] is True and attrs["source"] == f"{url}:embedding"
        # an up-to-date output is left alone; another model's needs --overwrite
        assert (
            run_cli(
                "apply",
                tmp_path / "m.npz",
                url,
                "-o",
                out,
                *common,
                *(["--keep-columns", "id"] if out.endswith("parquet") else []),
            )[0]
            == EXIT_NOTHING_TO_DO
        )
    fs = s3fs_client(s3_server)
    # nothing but the outputs is left: no parts, no progress records
    assert sorted(fs.ls(f"{s3_bucket[5:]}/out")) == [f"{s3_bucket[5:]}/out/w.parquet", f"{s3_bucket[5:]}/out/w.zarr"]
    import pyarrow.parquet as pq

    with fs.open(f"{s3_bucket[5:]}/out/w.parquet") as handle:
        table = pq.read_table(handle)
    assert table.column("id").to_pylist() == list(range(len(corpus)))
    # an output over its input is refused, whatever --overwrite says
    code, _, err = run_cli("apply", tmp_path / "m.npz", url, "-o", f"{s3_bucket}/in/c.parquet", "--overwrite", "-q")
    assert code == EXIT_BAD_INPUT and "would overwrite the input" in err
    # --compressor is not (yet) written to object storage: refused, not silently ignored
    code, _, err = run_cli(
        "apply", tmp_path / "m.npz", url, "-o", f"{s3_bucket}/out/z.zarr", "--compressor", "zstd", "-q"
    )
    assert code == EXIT_BAD_INPUT and "--compressor is not supported for object-storage outputs" in err
    assert not fs.exists(f"{s3_bucket[5:]}/out/z.zarr")


def test_overwrite_never_replaces_a_users_objects_on_s3(tmp_path, s3_bucket, s3_server, corpus, run_cli):
    """Issue #23 on object storage: --overwrite replaces only an output of ours of the same kind; a
    user's objects under an output's prefix, or a Parquet object of theirs, are refused (exit 2, one
    line) and left as they were. (No lock on object storage: a prefix cannot be locked.)"""
    pytest.importorskip("pyarrow")
    local = write_parquet(tmp_path / "c.parquet", corpus, 500)
    assert run_cli("fit", local, "-o", tmp_path / "m.npz", "-q")[0] == 0
    fs = s3fs_client(s3_server)
    bucket = s3_bucket[5:]
    fs.pipe(f"{bucket}/out/w.zarr/thesis.txt", b"years of work")
    fs.pipe(f"{bucket}/out/w.parquet", b"PAR1 mine")
    for out in (f"{s3_bucket}/out/w.zarr", f"{s3_bucket}/out/w.parquet"):
        code, _, err = run_cli("apply", tmp_path / "m.npz", local, "-o", out, "--overwrite", "-q")
        assert code == EXIT_BAD_INPUT, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"{out}: exists and is not" in lines[0] and "move it away" in lines[0], err
    assert fs.cat(f"{bucket}/out/w.zarr/thesis.txt") == b"years of work"
    assert fs.cat(f"{bucket}/out/w.parquet") == b"PAR1 mine"
    assert sorted(fs.find(f"{bucket}/out")) == [f"{bucket}/out/w.parquet", f"{bucket}/out/w.zarr/thesis.txt"]
    # an output of ours there is replaced
    assert run_cli("apply", tmp_path / "m.npz", local, "-o", f"{s3_bucket}/out/x.zarr", "-q")[0] == 0
    code, _, err = run_cli(
        "apply", tmp_path / "m.npz", local, "-o", f"{s3_bucket}/out/x.zarr", "-q", "-k", "3", "--overwrite"
    )
    assert code == 0, err
    assert read_attrs(f"{s3_bucket}/out/x.zarr")["n_components"] == 3


def test_reading_a_parquet_objects_footer_or_column_closes_the_file_it_opened(s3_bucket, s3_server):
    """Whether a Parquet object may be replaced, and a column of it, are read through an fsspec file that
    pyarrow never closes: closed when read, not left open with its read-ahead buffer until a collection."""
    import gc
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    from streamwhiten.io import parquet

    buffer = io.BytesIO()
    pq.write_table(pa.table({"score": [0.5, 1.0, 2.0]}), buffer)
    fs = s3fs_client(s3_server)
    fs.pipe(f"{s3_bucket[5:]}/theirs.parquet", buffer.getvalue())
    fs.pipe(f"{s3_bucket[5:]}/damaged.parquet", b"PAR1 mine")
    url, read = f"{s3_bucket}/theirs.parquet", ReadOptions()
    gc.collect()
    gc.disable()  # a file left open stays so (a reference cycle) until this test looks
    try:
        found = parquet.foreign_output(url, read), parquet.foreign_output(f"{s3_bucket}/damaged.parquet", read)
        values, _ = parquet.read_vector(url, "score", read)
        mine = (f"{s3_bucket[5:]}/theirs.parquet", f"{s3_bucket[5:]}/damaged.parquet")  # not other tests' files
        # type(), not isinstance(): isinstance reads a dead weak proxy's __class__ and raises ReferenceError
        left = [f for f in gc.get_objects() if type(f) is s3fs.core.S3File and f.path in mine and not f.closed]
    finally:
        gc.enable()
    assert found == ("a Parquet file streamwhiten did not write", "not a Parquet file")
    assert values.tolist() == [0.5, 1.0, 2.0]
    assert left == []


def test_update_from_s3_picks_up_appended_rows_and_new_shards(tmp_path, s3_bucket, s3_server, run_cli):
    data = anisotropic(4000, 12, seed=3)  # float64: the update equals the refit to rounding of the merge
    first = write_zarr(tmp_path / "a.zarr", data[:2500], chunk_rows=250)
    upload(s3_server, first, f"{s3_bucket}/a.zarr")
    assert run_cli("fit", f"{s3_bucket}/*.zarr", "-o", tmp_path / "m.npz", "-q")[0] == 0
    # rows appended to the remote store, and a new shard beside it
    import zarr

    store = remote.zarr_store(f"{s3_bucket}/a.zarr", read_only=False, read=ReadOptions())
    array = zarr.open_array(store=store, mode="r+")
    array.resize((3000, 12))
    array[2500:3000] = data[2500:3000]
    upload(s3_server, write_zarr(tmp_path / "b.zarr", data[3000:], chunk_rows=250), f"{s3_bucket}/b.zarr")
    code, out, err = run_cli("fit", f"{s3_bucket}/*.zarr", "--update", tmp_path / "m.npz", "-q")
    assert code == 0, err
    assert "1,500 new rows" in out
    from streamwhiten.core.model import load_model

    updated = load_model(tmp_path / "m.npz")
    assert updated.n_rows == 4000
    np.testing.assert_allclose(updated.state.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(updated.state.scatter, (data - data.mean(0)).T @ (data - data.mean(0)), rtol=1e-11)
    # a rewritten old row is refused
    array[0] = data[0] + 1
    code, _, err = run_cli("fit", f"{s3_bucket}/*.zarr", "--update", tmp_path / "m.npz", "-q")
    assert code == EXIT_BAD_INPUT and "differ from the recorded ones" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------- kill -9


def _run(*args, env=None, timeout=300):
    env = dict(env or os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "streamwhiten", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _spawn(*args, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "streamwhiten", *map(str, args)],
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(10),  # below the test, which must see its progress before it finishes
    )


@pytest.mark.slow
def test_kill_9_of_a_remote_fit_and_a_remote_apply_resume_bit_identically(tmp_path, s3_bucket, s3_server, run_cli):
    from streamwhiten.engine.fit import load_checkpoint
    from streamwhiten.job import default_checkpoint

    data = anisotropic(6000, 16, seed=11).astype(np.float32)
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", data, chunk_rows=100), f"{s3_bucket}/c.zarr")
    opts = ["--chunk-rows", "100", "--threads", "2", "-q"]
    assert run_cli("fit", url, "-o", tmp_path / "whole.npz", *opts)[0] == 0
    model = tmp_path / "killed.npz"
    checkpoint = default_checkpoint(str(model))

    def rows_done():
        try:
            return load_checkpoint(checkpoint).rows_done
        except Exception:
            return -1

    process = _spawn("fit", url, "-o", model, *opts, "--checkpoint-every", "1")
    killed = kill_when(process, rows_done, 2000)
    assert killed and not model.exists() and 0 < rows_done() < 6000
    code, out, err = run_cli("fit", url, "-o", model, *opts)
    assert code == 0 and "(resumed)" in out, err
    assert statistics(model) == statistics(tmp_path / "whole.npz")

    # apply to s3: killed half-way, the output is absent for every reader; a rerun resumes it
    fs = s3fs_client(s3_server)
    out = f"{s3_bucket}/out/w.zarr"
    record = f"{s3_bucket[5:]}/out/.w.zarr.partial.progress.json"
    apply_opts = ["-k", "8", "--chunk-rows", "100", "--checkpoint-seconds", "0", "--threads", "2", "-q"]
    assert run_cli("apply", tmp_path / "whole.npz", tmp_path / "c.zarr", "-o", tmp_path / "w.zarr", *apply_opts)[0] == 0

    def applied():
        try:
            return json.loads(fs.cat_file(record))["rows_done"]
        except Exception:
            return -1

    process = _spawn("apply", tmp_path / "whole.npz", url, "-o", out, *apply_opts)
    assert kill_when(process, applied, 2000)
    assert fs.exists(f"{s3_bucket[5:]}/out/w.zarr/zarr.json")  # written in place: but not complete
    assert not output_exists(out)
    code, _, err = run_cli("fit", out, "-o", tmp_path / "never.npz", "-q")
    assert code == EXIT_BAD_INPUT and "not complete" in err
    done_before = applied()
    code, out_text, err = run_cli("apply", tmp_path / "whole.npz", url, "-o", out, *apply_opts, "--json")
    assert code == 0, err
    assert json.loads(out_text)["resumed_at_row"] == done_before > 0
    with open_source(out) as written, open_source(str(tmp_path / "w.zarr")) as local:
        assert written.read(0, 6000).tobytes() == local.read(0, 6000).tobytes()
    assert read_attrs(out)["complete"] is True and not fs.exists(record)


@pytest.mark.slow
def test_a_killed_remote_parquet_output_is_never_visible_and_resumes(tmp_path, s3_bucket, s3_server, run_cli):
    pytest.importorskip("pyarrow")
    data = anisotropic(6000, 16, seed=12).astype(np.float32)
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", data, chunk_rows=100), f"{s3_bucket}/c.zarr")
    assert run_cli("fit", tmp_path / "c.zarr", "-o", tmp_path / "m.npz", "-q")[0] == 0
    fs = s3fs_client(s3_server)
    out = f"{s3_bucket}/w.parquet"
    record = f"{s3_bucket[5:]}/.w.parquet.partial.progress.json"
    opts = ["-k", "8", "--chunk-rows", "100", "--checkpoint-seconds", "0", "--threads", "2", "-q"]

    def applied():
        try:
            return json.loads(fs.cat_file(record))["rows_done"]
        except Exception:
            return -1

    process = _spawn("apply", tmp_path / "m.npz", url, "-o", out, *opts)
    assert kill_when(process, applied, 3000)
    assert not fs.exists(out[5:]) and not output_exists(out)
    code, text, err = run_cli("apply", tmp_path / "m.npz", url, "-o", out, *opts, "--json")
    assert code == 0 and json.loads(text)["resumed_at_row"] > 0, err
    assert run_cli("apply", tmp_path / "m.npz", tmp_path / "c.zarr", "-o", tmp_path / "w.parquet", *opts)[0] == 0
    with open_source(out) as written, open_source(str(tmp_path / "w.parquet")) as local:
        assert written.read(0, 6000).tobytes() == local.read(0, 6000).tobytes()
    assert fs.ls(s3_bucket[5:]) == [f"{s3_bucket[5:]}/c.zarr", f"{s3_bucket[5:]}/w.parquet"]


# ------------------------------------------------------------------------------- run and Dask


def test_run_job_with_s3_inputs_outputs_and_a_storage_table(tmp_path, s3_bucket, s3_server, corpus):
    upload(s3_server, write_zarr(tmp_path / "a.zarr", corpus[:1500], chunk_rows=250), f"{s3_bucket}/in/a.zarr")
    upload(s3_server, write_zarr(tmp_path / "b.zarr", corpus[1500:], chunk_rows=250), f"{s3_bucket}/in/b.zarr")
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["{s3_bucket}/in/*.zarr"]\n[model]\npath = "m.npz"\n'
        f'[apply]\noutput = "{s3_bucket}/out/{{stem}}.zarr"\n'
        f'[storage]\nendpoint_url = "{s3_server}"\nsecret = "{S3_SECRET}"\nkey = "sw-test-key"\n'
    )
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_SECRET_ACCESS_KEY": "wrong", "AWS_ACCESS_KEY_ID": "wrong"}
    result = _run("run", job, env=dict(os.environ, **env))
    assert result.returncode == 0, result.stderr
    assert S3_SECRET not in result.stderr + result.stdout
    result = _run("run", job, env=dict(os.environ, **env))
    assert result.returncode == EXIT_NOTHING_TO_DO, result.stderr  # the staleness check reads the outputs
    fs = s3fs_client(s3_server)
    fs.rm(f"{s3_bucket[5:]}/out/b.zarr/zarr.json")  # an output without its metadata is absent: rewritten
    result = _run("run", job, env=dict(os.environ, **env))
    assert result.returncode == 0, result.stderr
    assert f"{s3_bucket}/out/a.zarr is up to date" in result.stderr and f"wrote {s3_bucket}/out/b.zarr" in result.stderr


def test_dask_fit_and_apply_from_s3_equal_the_serial_engine(tmp_path, s3_bucket, s3_server, run_cli):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from streamwhiten.core.model import load_model
    from streamwhiten.engine.distributed import apply_dask, fit_dask
    from streamwhiten.engine.fit import fit_sources

    data = anisotropic(4000, 16, seed=5)
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", data, chunk_rows=500), f"{s3_bucket}/c.zarr")
    # the workers get the storage options from the driver; their environment has no endpoint
    options = {"endpoint_url": s3_server, "key": "sw-test-key", "secret": S3_SECRET}
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
        ) as cluster,
        Client(cluster) as client,
    ):
        read = ReadOptions(storage_options=options)  # given to every call: there is no process-wide setting
        distributed = fit_dask([url], cluster=DaskEngine(client=client), read=read)
        serial = fit_sources([url], read=read)
        given = [f"--storage-option={key}={value}" for key, value in options.items()]
        assert run_cli("fit", url, "-o", tmp_path / "m.npz", "-q", *given)[0] == 0
        model = load_model(tmp_path / "m.npz")
        apply_dask(
            model,
            url,
            f"{s3_bucket}/w.zarr",
            ApplyOptions(),
            replace(read, block_rows=500),
            cluster=DaskEngine(client=client),
        )
        written = open_source(f"{s3_bucket}/w.zarr", read=read).read(0, 4000)
    np.testing.assert_allclose(distributed.state.scatter, serial.state.scatter, rtol=1e-12)
    np.testing.assert_allclose(distributed.state.mean, serial.state.mean, rtol=1e-12)
    assert distributed.state.n_rows == serial.state.n_rows == 4000
    np.testing.assert_allclose(
        written, load_model(tmp_path / "m.npz").transform(data).astype(np.float32), rtol=1e-5, atol=1e-5
    )
    assert read_attrs(f"{s3_bucket}/w.zarr")["complete"] is True


# ------------------------------------------------------------------------ failures and secrets


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that resets every ``every``-th connection as soon as a
    request arrives, and cuts every ``every``-th response (offset by one) after a few KiB."""

    def __init__(self, target_port: int, every: int = 3, refuse_all: bool = False):
        self.target, self.every, self.refuse_all = target_port, every, refuse_all
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.count = 0
        self.dropped = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _reset(sock):
        import struct

        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            pass

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.count += 1
                number = self.count
            threading.Thread(target=self._serve, args=(client, number), daemon=True).start()

    def _serve(self, client, number):
        if self.refuse_all or number % self.every == 0:
            try:
                client.recv(1024)
            except OSError:
                pass
            self.dropped += 1
            return self._reset(client)
        upstream = socket.create_connection(("127.0.0.1", self.target))
        cut = 8192 if number % self.every == 1 and number > 1 else None

        def pump(src, dst, limit):
            sent = 0
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if limit is not None and sent + len(data) > limit:
                        self.dropped += 1
                        break
                    dst.sendall(data)
                    sent += len(data)
            except OSError:
                pass
            for sock in (client, upstream):  # wakes the other direction's thread, which a close would not
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        other = threading.Thread(target=pump, args=(client, upstream, None), daemon=True)
        other.start()
        pump(upstream, client, cut)
        other.join()
        client.close()
        upstream.close()

    def close(self):
        self.server.close()


def test_transient_failures_through_a_dropping_proxy_leave_the_result_unchanged(
    tmp_path, s3_bucket, s3_server, run_cli
):
    data = anisotropic(4000, 16, seed=9).astype(np.float32)
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", data, chunk_rows=250), f"{s3_bucket}/c.zarr")
    opts = ["--chunk-rows", "500", "--threads", "2", "-q"]
    assert run_cli("fit", url, "-o", tmp_path / "direct.npz", *opts)[0] == 0
    assert run_cli("apply", tmp_path / "direct.npz", url, "-o", tmp_path / "direct.zarr", "-k", "8", *opts)[0] == 0
    proxy = DroppingProxy(int(s3_server.rsplit(":", 1)[1]), every=3)
    try:
        via = ["--storage-option", f"endpoint_url={proxy.endpoint}"]
        code, _, err = run_cli("fit", url, "-o", tmp_path / "proxied.npz", *opts, *via)
        assert code == 0, err
        code, _, err = run_cli(
            "apply", tmp_path / "direct.npz", url, "-o", f"{s3_bucket}/out.zarr", "-k", "8", *opts, *via
        )
        assert code == 0, err
    finally:
        proxy.close()
        remote.clear_cache()
    assert proxy.dropped >= 3
    assert statistics(tmp_path / "proxied.npz") == statistics(tmp_path / "direct.npz")
    with open_source(f"{s3_bucket}/out.zarr") as written, open_source(str(tmp_path / "direct.zarr")) as local:
        got, want = written.read(0, 4000), local.read(0, 4000)
    differ = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)).any(axis=1))
    if differ.size:  # say which rows, and where the rows written there belong
        found = [int(np.flatnonzero((want == got[row]).all(axis=1))[:1].sum(initial=-1)) for row in differ[:3]]
        pytest.fail(f"{differ.size} rows differ from row {differ[0]} to {differ[-1]}; the first hold rows {found}")


def test_a_lasting_failure_is_exit_74_naming_the_url_and_leaves_nothing_complete(tmp_path, s3_bucket, s3_server):
    data = anisotropic(2000, 8, seed=2).astype(np.float32)
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", data, chunk_rows=250), f"{s3_bucket}/c.zarr")
    proxy = DroppingProxy(int(s3_server.rsplit(":", 1)[1]), refuse_all=True)
    env = dict(os.environ, STREAMWHITEN_REMOTE_TIMEOUT="2", STREAMWHITEN_REMOTE_BACKOFF="0.01")
    try:
        result = _run(
            "fit",
            url,
            "-o",
            tmp_path / "m.npz",
            "--storage-option",
            f"endpoint_url={proxy.endpoint}",
            env=env,
            timeout=120,
        )
    finally:
        proxy.close()
    assert result.returncode == EXIT_IO, result.stderr
    assert result.stderr.count("\n") == 1 and url in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "m.npz").exists()


def test_wrong_credentials_and_a_missing_bucket_are_one_line_errors(tmp_path, s3_server):
    # a second server that checks credentials (after its first action, the bucket's creation)
    import re

    from conftest import _free_port

    port = _free_port()
    server = start_moto(port, INITIAL_NO_AUTH_ACTION_COUNT="1")
    try:
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="guarded")  # the one unchecked action
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_MAX_ATTEMPTS="1")
        result = _run("fit", "s3://guarded/c.zarr", "-o", tmp_path / "m.npz", env=env, timeout=120)
        assert result.returncode == EXIT_IO, result.stderr
        assert result.stderr.count("\n") == 1 and "s3://guarded/c.zarr" in result.stderr
        assert re.search("access denied|credentials", result.stderr), result.stderr
        assert S3_SECRET not in result.stderr
    finally:
        server.terminate()
        server.wait(10)
    result = _run("fit", "s3://no-such-bucket-sw/c.zarr", "-o", tmp_path / "m.npz", timeout=120)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == (
        "streamwhiten: error: s3://no-such-bucket-sw/c.zarr: no such object or prefix "
        "(the bucket s3://no-such-bucket-sw does not exist)"
    )


def test_credentials_never_reach_a_model_checkpoint_output_or_message(tmp_path, s3_bucket, s3_server, corpus):
    url = upload(s3_server, write_zarr(tmp_path / "c.zarr", corpus, chunk_rows=250), f"{s3_bucket}/c.zarr")
    # credentials given only as storage options (the environment's are wrong)
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="wrong-secret", AWS_ACCESS_KEY_ID="wrong")
    creds = ["--storage-option", f"secret={S3_SECRET}", "--storage-option", "key=sw-test-key"]
    model = tmp_path / "m.npz"
    process = _spawn(
        "fit",
        url,
        "-o",
        model,
        "--chunk-rows",
        "250",
        "--checkpoint-every",
        "1",
        *creds,
        env={"AWS_SECRET_ACCESS_KEY": "wrong-secret", "AWS_ACCESS_KEY_ID": "wrong"},
    )
    checkpoint = tmp_path / ".m.npz.checkpoint"
    killed = kill_when(process, checkpoint.exists, True)
    files = {checkpoint: checkpoint.read_bytes()} if checkpoint.exists() else {}
    texts = [process.stderr.read()]
    result = _run("fit", url, "-o", model, "--chunk-rows", "250", *creds, env=env)
    assert result.returncode == rerun_code(killed), result.stderr
    result2 = _run("apply", model, url, "-o", f"{s3_bucket}/w.zarr", "-k", "4", *creds, env=env)
    result3 = _run("apply", model, url, "-o", f"{s3_bucket}/w.parquet", "-k", "4", *creds, env=env)
    bad = _run("fit", f"{s3_bucket}/missing.zarr", "-o", tmp_path / "x.npz", *creds, env=env)
    assert result2.returncode == result3.returncode == 0 and bad.returncode == EXIT_BAD_INPUT
    files[model] = model.read_bytes()
    fs = s3fs_client(s3_server)
    for key in fs.find(s3_bucket[5:]):
        if not key.startswith(f"{s3_bucket[5:]}/c.zarr"):
            files[key] = fs.cat_file(key)
    texts += [r.stdout + r.stderr for r in (result, result2, result3, bad)]
    assert any(str(k).endswith("zarr.json") for k in files) and any(str(k).endswith("w.parquet") for k in files)
    for name, content in files.items():
        assert S3_SECRET.encode() not in content, name
    for text in texts:
        assert S3_SECRET not in text


def test_hdf5_lance_and_plain_http_inputs(tmp_path, s3_bucket, s3_server, corpus, run_cli):
    """HDF5 (read through an fsspec file object), Lance (pylance's own object store) and https-style URLs
    (fsspec's HTTP file system, range requests; the local server serves objects at http://host/bucket/key)."""
    from conftest import write_h5

    local_h5 = write_h5(tmp_path / "c.h5", corpus, chunk_rows=500)
    np.save(tmp_path / "c.npy", corpus)
    upload(s3_server, tmp_path / "c.h5", f"{s3_bucket}/c.h5")
    upload(s3_server, tmp_path / "c.npy", f"{s3_bucket}/c.npy")
    opts = ["--chunk-rows", "500", "--threads", "2", "-q"]
    assert run_cli("fit", local_h5, "-o", tmp_path / "local.npz", *opts)[0] == 0
    s3fs_client(s3_server).chmod(f"{s3_bucket[5:]}/c.npy", acl="public-read")  # readable without credentials
    http = f"{s3_server}/{s3_bucket[5:]}/c.npy"
    for name, spec in (("h5", f"{s3_bucket}/c.h5:/emb"), ("http", http)):
        code, _, err = run_cli("fit", spec, "-o", tmp_path / f"{name}.npz", *opts)
        assert code == 0, err
        assert statistics(tmp_path / f"{name}.npz") == statistics(tmp_path / "local.npz"), name
    lance = pytest.importorskip("lance")
    import pyarrow as pa

    table = pa.table({"vector": pa.FixedSizeListArray.from_arrays(pa.array(corpus.reshape(-1)), corpus.shape[1])})
    lance.write_dataset(table, str(tmp_path / "c.lance"), max_rows_per_file=1000)
    upload(s3_server, tmp_path / "c.lance", f"{s3_bucket}/c.lance")
    assert run_cli("fit", tmp_path / "c.lance", "-o", tmp_path / "local-lance.npz", *opts)[0] == 0
    code, _, err = run_cli("fit", f"{s3_bucket}/c.lance", "-o", tmp_path / "lance.npz", *opts)
    assert code == 0, err
    assert statistics(tmp_path / "lance.npz") == statistics(tmp_path / "local-lance.npz")
    # a glob over an object prefix names each store once
    from streamwhiten.io import expand_specs

    assert expand_specs([f"{s3_bucket}/c.*"]) == [f"{s3_bucket}/c.h5", f"{s3_bucket}/c.lance", f"{s3_bucket}/c.npy"]


# ------------------------------------------------------------------------- giving up within the deadline


def _outage(kind, tmp_path, s3_bucket, s3_server, timeout):
    """Run a fit against an S3 endpoint that stops answering: a port nobody listens on from the start, or a
    server of its own that is stopped once the fit has read its first blocks. Returns the result and the
    seconds from the start of the outage to the exit."""
    from conftest import _free_port

    data = anisotropic(40_000, 32, seed=4).astype(np.float32)
    local = write_zarr(tmp_path / "c.zarr", data, chunk_rows=1000)
    args = ["-o", tmp_path / "m.npz", "--chunk-rows", "1000", "--checkpoint-every", "1", "--threads", "2"]
    args += [] if timeout is None else ["--remote-timeout", timeout]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("AWS_MAX_ATTEMPTS", None)  # the retries of botocore as a user gets them
    if kind == "closed-port":
        url = upload(s3_server, local, f"{s3_bucket}/c.zarr")
        began = time.monotonic()
        done = _run("fit", url, *args, "--storage-option", f"endpoint_url=http://127.0.0.1:{_free_port()}", env=env)
        return done, time.monotonic() - began, url
    port = _free_port()
    server = start_moto(port)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3fs_client(endpoint).mkdir("outage")
        url = upload(endpoint, local, "s3://outage/c.zarr")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamwhiten",
                *map(str, ["fit", url, *args, "--storage-option", f"endpoint_url={endpoint}"]),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        checkpoint = tmp_path / ".m.npz.checkpoint"
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        server.kill()
        server.wait(10)
    began = time.monotonic()
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), time.monotonic() - began, url


@pytest.mark.parametrize("kind", ["closed-port", "server-stopped-mid-fit"])
def test_giving_up_on_a_store_that_stopped_answering_takes_the_remote_timeout(tmp_path, s3_bucket, s3_server, kind):
    """Every layer's retries (ours, s3fs's, botocore's, zarr's) fit in --remote-timeout: the command exits 74
    about that long after the store stopped answering (before the deadline: 49 to 128 s), naming the URL."""
    done, seconds, url = _outage(kind, tmp_path, s3_bucket, s3_server, 3)
    lines = done.stderr.splitlines()
    assert done.returncode == EXIT_IO and len(lines) == 1, done.stderr
    assert url in lines[0] and "(--remote-timeout 3)" in lines[0], lines
    assert 3 <= seconds < 3 + 5, f"gave up {seconds:.1f} s after the outage began, with --remote-timeout 3"
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.slow
def test_the_default_remote_timeout_gives_up_in_about_ten_seconds(tmp_path, s3_bucket, s3_server):
    done, seconds, url = _outage("server-stopped-mid-fit", tmp_path, s3_bucket, s3_server, None)
    assert done.returncode == EXIT_IO and "(--remote-timeout 10)" in done.stderr, done.stderr
    assert 10 <= seconds < 10 + 5, f"gave up {seconds:.1f} s after the server stopped"


def test_a_remote_apply_that_gives_up_names_its_output_once(tmp_path, s3_bucket, s3_server):
    """Issue #36: an apply writing to object storage whose server stops answering mid-write exits 74 with
    one line that names the output once (the write's own error was wrapped again, its prefix repeated)."""
    from conftest import _free_port

    from streamwhiten import Whitener

    data = anisotropic(40_000, 32, seed=4).astype(np.float32)
    local = write_zarr(tmp_path / "c.zarr", data, chunk_rows=1000)
    Whitener().fit(data[:2000]).save(str(tmp_path / "m.npz"))
    port = _free_port()
    server = start_moto(port)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = s3fs_client(endpoint)
        client.mkdir("outage")
        url = "s3://outage/out.zarr"
        env = {"AWS_ENDPOINT_URL": endpoint}
        process = _spawn(
            "apply", tmp_path / "m.npz", local, "-o", url, "--chunk-rows", "1000", "--remote-timeout", "2", env=env
        )
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            client.invalidate_cache()
            if len(client.find("outage/out.zarr")) > 3:  # metadata and some chunks are written
                break
            time.sleep(0.05)
    finally:
        server.kill()
        server.wait(10)
    out, err = process.communicate(timeout=300)
    lines = err.splitlines()
    assert process.returncode == EXIT_IO and len(lines) == 1, err
    assert lines[0].count(url) == 1 and "(--remote-timeout 2)" in lines[0], lines
