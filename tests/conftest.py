"""Shared fixtures: small stores on disk, the CLI runner, and the path to the real STS-B data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

from streamwhiten.progress import Reporter

# pytest imports this file as ``tests.conftest`` (--import-mode=importlib, pyproject.toml); test modules and the
# helper modules beside it import their helpers ``from conftest import ...`` (tests/ is on pythonpath): one module.
sys.modules.setdefault("conftest", sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]


def _numba_cache_for_the_run() -> None:
    """One Numba cache directory for this run, made before numba is imported and inherited by every process
    the run starts (xdist workers, CLI subprocesses), so each kernel compiles once per run, not once per
    process, and never reads a cache another checkout or an older edit of the kernels left beside the source.
    The process that made it removes it at exit; a cache the user set (``NUMBA_CACHE_DIR``) is kept as given."""
    import atexit
    import shutil
    import tempfile

    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    folder = tempfile.mkdtemp(prefix="streamwhiten-test-numba-")
    os.environ["NUMBA_CACHE_DIR"] = folder
    atexit.register(shutil.rmtree, folder, True)


_numba_cache_for_the_run()
STSB_DEFAULT = REPO.parent / "shared" / "data" / "stsb" / "stsb-dev-minilm.h5"


def optional_module(name: str):
    """The module ``name`` imported on first use of one of its attributes, not when a test file is
    collected: collection stays free of the optional extras (dask, pyarrow, lance, matplotlib), which cost
    seconds to import and which most runs of a few tests never touch. Pair it with :func:`needs`."""
    import importlib
    import types

    class _OnFirstUse(types.ModuleType):
        def __getattr__(self, attribute: str):
            if attribute.startswith("_"):  # pytest's probes of a module's names (__test__, ...) import nothing
                raise AttributeError(attribute)
            return getattr(importlib.import_module(name), attribute)

    return _OnFirstUse(name)


def needs(*names: str, reason: str):
    """A skip mark for a test file whose optional extras ``names`` are not installed, found without importing
    them (``importlib.util.find_spec`` of each top-level package)."""
    import importlib.util

    missing = [name for name in names if importlib.util.find_spec(name.split(".")[0]) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{reason} ({', '.join(missing)} missing)")


def anisotropic(n_rows: int, n_features: int, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Rows with a common offset and a decaying spectrum, float64."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((n_features, n_features)) * (1.0 / (1.0 + np.arange(n_features)))[:, None]
    return offset + rng.standard_normal((n_rows, n_features)) @ mixing


def write_h5(path, data, dataset="emb", chunk_rows=None) -> str:
    with h5py.File(path, "w") as handle:
        chunks = None if chunk_rows is None else (min(chunk_rows, max(1, data.shape[0])),) + tuple(data.shape[1:])
        handle.create_dataset(dataset, data=data, chunks=chunks)
    return f"{path}:/{dataset}"


def append_rows(path, data, dataset="emb") -> None:
    """Append ``data`` to the resizable dataset ``dataset`` of the HDF5 file ``path``, made (with its folder) on
    first use: a shard that grows night after night."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    width = data.shape[1]
    with h5py.File(path, "a") as handle:
        if dataset not in handle:
            handle.create_dataset(dataset, data=data, chunks=(100, width), maxshape=(None, width))
            return
        stored = handle[dataset]
        old = stored.shape[0]
        stored.resize((old + len(data), width))
        stored[old:] = data


def write_zarr(path, data, chunk_rows=100, zarr_format=3) -> str:
    array = zarr.create_array(
        store=str(path),
        shape=data.shape,
        chunks=(min(chunk_rows, max(1, data.shape[0])),) + data.shape[1:],
        dtype=data.dtype,
        zarr_format=zarr_format,
        compressors=None,
    )
    array[...] = data
    return str(path)


def write_task(tmp_path, seed=0, noise=1.0, n=1500, d=16, n_queries=40, graded=False, offset=0.0, loud=0.0):
    """A retrieval task on disk: a corpus with a decaying spectrum (plus ``offset``), queries near some of its
    rows (``noise``: isotropic, so full whitening amplifies it), those rows as the relevant documents in a
    qrels file (``graded``: grades 1-3 and a second relevant row for some), excluded pairs, HDF5 stores.
    ``loud``: more query noise of that spread along the corpus's loudest direction, which whitening quiets."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((d, d)) * np.geomspace(3, 0.05, d)[:, None]
    corpus = (rng.standard_normal((n, d)) @ basis + offset).astype(np.float32)
    picks = rng.choice(n, n_queries, replace=False)
    queries = corpus[picks] + noise * rng.standard_normal((n_queries, d))
    if loud:
        top = basis[0] / np.linalg.norm(basis[0])
        queries = queries + loud * rng.standard_normal((n_queries, 1)) * top
    queries = queries.astype(np.float32)
    triples = [(q, int(c), int(rng.integers(1, 4)) if graded else 1) for q, c in enumerate(picks)]
    if graded:  # a second, weaker relevant document for some queries
        triples += [(q, int((picks[q] + 7) % n), 1) for q in range(0, n_queries, 4)]
    excluded = sorted({(q, int(rng.integers(0, n))) for q in range(0, n_queries, 3)} - {(q, c) for q, c, _ in triples})
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t{g}\n" for q, c, g in triples))
    exclude = tmp_path / "exclude.tsv"
    exclude.write_text("query-id\tcorpus-id\n" + "".join(f"{q}\t{c}\n" for q, c in excluded))
    return dict(
        corpus=corpus, queries=queries, triples=triples, excluded=excluded, qrels=str(qrels), exclude=str(exclude),
        spec_q=write_h5(tmp_path / "q.h5", queries, chunk_rows=16),
        spec_c=write_h5(tmp_path / "c.h5", corpus, chunk_rows=256),
    )  # fmt: skip


class Phases(Reporter):
    """A progress reporter that records what it is told: ``begun`` holds each phase's name as it began,
    ``ended`` as it ended, ``counts`` every ``(done, total)``."""

    def __init__(self):
        self.begun, self.ended, self.counts = [], [], []

    def __call__(self, done, total):
        self.counts.append((done, total))

    def started(self, name, unit):
        self.begun.append(name)

    def finished(self, name, seconds):
        assert seconds >= 0 and name == self.begun[-1]  # phases do not nest
        self.ended.append(name)


def map_checksum(A, mean, beta, gamma, eps, k) -> str:
    """The ``model_checksum`` of a map, from its definition (``AffineMap.checksum``): SHA-256 over a tag,
    the float64 bytes of ``mean`` and ``A`` with their shapes, then beta, gamma, eps (float64) and k (int64)."""
    import hashlib
    import struct

    digest = hashlib.sha256(b"streamwhiten affine map 1")
    for name, array in (("mean", mean), ("A", A)):
        values = np.ascontiguousarray(array, dtype="<f8")
        digest.update(f"{name}{values.shape}".encode() + values.tobytes())
    return digest.update(struct.pack("<dddq", beta, gamma, eps, k)) or digest.hexdigest()


@pytest.fixture
def data64():
    return anisotropic(1000, 12, seed=1)


@pytest.fixture
def h5_store(tmp_path, data64):
    return write_h5(tmp_path / "in.h5", data64.astype(np.float32), chunk_rows=128)


@pytest.fixture
def stsb_path():
    path = Path(os.environ.get("STREAMWHITEN_STSB", STSB_DEFAULT))
    if not path.exists():
        pytest.skip(
            f"real STS-B embeddings not found at {path} (licensed data kept out of the repo; "
            "set STREAMWHITEN_STSB to its path)"
        )
    return path


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from streamwhiten.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """The bytes of a model (k = 4) fitted on ``user_files.SMALL``, for tests that refuse what users give."""
    from user_files import SMALL

    from streamwhiten import Whitener

    path = tmp_path_factory.mktemp("small-model") / "model.npz"
    Whitener(n_components=4).fit(SMALL).save(str(path))
    return path.read_bytes()


@pytest.fixture(scope="module")
def numba_cache(tmp_path_factory):
    """A numba cache of the test module's own for the commands ``strace_runs`` starts, so that no other
    process (another test run, an edit of the kernels) makes a run compile while the one counting calls
    did not."""
    import strace_runs

    strace_runs.ENV_EXTRA["NUMBA_CACHE_DIR"] = str(tmp_path_factory.mktemp("numba-cache"))
    yield strace_runs.ENV_EXTRA["NUMBA_CACHE_DIR"]
    strace_runs.ENV_EXTRA.clear()


def run_command(*args, **kwargs) -> subprocess.CompletedProcess:
    """A ``streamwhiten`` command run in this process (``cli.main``, as the entry point runs it), its output
    captured: what ``run_subprocess`` returns, at a fraction of the cost (no interpreter, no imports, no
    Numba cache load); ``cwd`` is the folder it runs in. A call that passes ``env``, ``input`` or a ``timeout``
    gets a real process: so does every test that needs one for what it checks (signals, kill -9, a second
    process, strace, another user)."""
    cwd = kwargs.pop("cwd", None)
    if kwargs:
        return run_subprocess(*args, cwd=cwd, **kwargs)
    import contextlib
    import io

    from streamwhiten.cli import main

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd or before)  # contextlib.chdir is Python 3.11+
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["streamwhiten", *map(str, args)], code, out.getvalue(), err.getvalue())


def run_subprocess(*args, **kwargs) -> subprocess.CompletedProcess:
    """A ``streamwhiten`` command in a process of its own (``python -m streamwhiten``)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "streamwhiten", *map(str, args)], capture_output=True, text=True, env=env, **kwargs
    )


# ----------------------------------------------------------------------------- a local S3 server

S3_SECRET = "sw-secret-Zq8vTt3hXk"  # the fixture's secret key: tests grep files and messages for it


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(port: int, **env) -> subprocess.Popen:
    """moto's S3-compatible server on 127.0.0.1:``port`` (nothing else is ever contacted)."""
    import shutil
    import socket
    import time

    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    command = [executable] if executable else [sys.executable, "-m", "moto.server"]
    process = subprocess.Popen(
        command + ["-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, **env),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("moto_server exited at start") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto_server did not start")


#: The environment every remote test runs in: dummy credentials, the local endpoint, no instance metadata,
#: no shared config files (no profile of the machine's user is read).
def s3_environment(endpoint: str) -> dict:
    return {
        "AWS_ACCESS_KEY_ID": "sw-test-key",
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_MAX_ATTEMPTS": "3",
    }


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 for the session, with the environment pointing at it (restored after)."""
    pytest.importorskip("moto", reason="remote tests need moto[server] and s3fs: pip install -e '.[test]'")
    pytest.importorskip("s3fs")
    port = _free_port()
    process = start_moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {key: os.environ.get(key) for key in s3_environment(endpoint)}
    os.environ.update(s3_environment(endpoint))
    try:
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        process.terminate()
        process.wait(10)


@pytest.fixture
def s3_bucket(s3_server, request):
    """A new, empty bucket on the local server: ``s3://NAME``."""
    import re
    import uuid

    import s3fs

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:8]
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server}, skip_instance_cache=True)
    fs.mkdir(name)
    from streamwhiten.io import remote

    remote.clear_cache()  # a clean slate: no cached file systems
    return f"s3://{name}"


def s3fs_client(endpoint: str):
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True, use_listings_cache=False
    )
