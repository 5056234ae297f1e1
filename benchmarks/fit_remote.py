"""Fit from an S3-compatible server against the same store on local disk and against dask reading the same
objects, measured side by side in one run.

A local S3 server (moto's server mode on 127.0.0.1; nothing else is contacted) holds a ``--rows`` x
``--dim`` float32 Zarr store (uncompressed, ``--chunk-rows`` rows per chunk object) and the same rows as an
HDF5 file and a ``.npy``. In interleaved rounds (best of each kept, the median of the per-round ratios
beside it):

- ``local``: ``fit_sources`` on the Zarr store on local disk (warm page cache; raw local-chunk reads);
- ``s3``: ``fit_sources`` on ``s3://bench/rows.zarr`` with its remote defaults (8 worker threads, each
  reading whole blocks of chunks, zarr fetching a block's chunks concurrently);
- ``dask``: ``dask.array.from_zarr("s3://bench/rows.zarr")`` and ``(x.T @ x).compute()`` (dask's threaded
  scheduler, one task per chunk), the issue's reference;
- ``s3_npy`` and ``s3_hdf5``: the same rows as one ``.npy`` object (range requests) and as an HDF5 file read
  through an fsspec file object, against ``local_hdf5``.

Requests are counted where they are made (s3fs's ``_call_s3``, wrapped): total, and the most in flight at
once. The server runs on this machine, so its own CPU time competes with the fit's: the figures measure
the client's overheads and concurrency, not a network.

    python benchmarks/fit_remote.py            # 131,072 x 768 (384 MiB)
    python benchmarks/fit_remote.py --quick    # a tiny smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
from _common import interleaved_times, print_table, row_pool, save_results, warm_page_cache


def start_server():
    """moto's S3 server on a free port of 127.0.0.1, and the environment pointing at it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    executable = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    command = [executable] if executable else [sys.executable, "-m", "moto.server"]
    process = subprocess.Popen(
        command + ["-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }
    )
    return process, endpoint


class RequestCounter:
    """Counts s3fs requests (every S3 call goes through ``S3FileSystem._call_s3``) and the most in flight."""

    def __init__(self):
        import s3fs

        self.total = self.now = self.peak = 0
        original = s3fs.S3FileSystem._call_s3
        counter = self

        async def counted(fs, *args, **kwargs):
            counter.total += 1
            counter.now += 1
            counter.peak = max(counter.peak, counter.now)
            try:
                return await original(fs, *args, **kwargs)
            finally:
                counter.now -= 1

        s3fs.S3FileSystem._call_s3 = counted

    def reset(self):
        self.total = self.peak = 0


def make_rows(n_rows: int, d: int) -> np.ndarray:
    pool = row_pool(d)
    rows = np.empty((n_rows, d), dtype=np.float32)
    for start in range(0, n_rows, pool.shape[0]):
        count = min(pool.shape[0], n_rows - start)
        rows[start : start + count] = pool[:count] + np.float32(1e-3 * (start // pool.shape[0]))
    return rows


def write_stores(directory: str, rows: np.ndarray, chunk_rows: int, endpoint: str) -> dict:
    import h5py
    import s3fs
    import zarr

    local = os.path.join(directory, "rows.zarr")
    shutil.rmtree(local, ignore_errors=True)
    array = zarr.create_array(
        store=local, shape=rows.shape, chunks=(chunk_rows, rows.shape[1]), dtype="float32", compressors=None
    )
    array[...] = rows
    with h5py.File(os.path.join(directory, "rows.h5"), "w") as handle:
        handle.create_dataset("emb", data=rows, chunks=(chunk_rows, rows.shape[1]))
    np.save(os.path.join(directory, "rows.npy"), rows)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    fs.mkdir("bench")
    fs.put(local, "bench/rows.zarr", recursive=True)
    fs.put_file(os.path.join(directory, "rows.h5"), "bench/rows.h5")
    fs.put_file(os.path.join(directory, "rows.npy"), "bench/rows.npy")
    return {
        "local": local,
        "local_hdf5": os.path.join(directory, "rows.h5") + ":/emb",
        "s3": "s3://bench/rows.zarr",
        "s3_npy": "s3://bench/rows.npy",
        "s3_hdf5": "s3://bench/rows.h5:/emb",
    }


def measure(directory: str, n_rows: int, d: int, chunk_rows: int, repeats: int, endpoint: str) -> dict:
    import dask
    import dask.array as da

    from streamwhiten import release_buffers
    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.io import remote

    rows = make_rows(n_rows, d)
    specs = write_stores(directory, rows, chunk_rows, endpoint)
    warm_page_cache(specs["local"])
    warm_page_cache(specs["local_hdf5"].split(":")[0])
    counter = RequestCounter()
    held, requests = {}, {}

    def fit(name):
        def run():
            counter.reset()
            held[name] = fit_sources(specs[name])
            requests[name] = (counter.total, counter.peak)

        return run

    def dask_fit():
        counter.reset()
        x = da.from_zarr(specs["s3"], storage_options={"use_listings_cache": False})
        with dask.config.set(scheduler="threads"):
            held["dask"] = (x.T @ x).compute()
        requests["dask"] = (counter.total, counter.peak)

    functions = {name: fit(name) for name in ("local", "s3", "dask", "s3_npy", "s3_hdf5", "local_hdf5")}
    functions["dask"] = dask_fit
    times = interleaved_times(functions, repeats)
    release_buffers()
    best = {name: min(values) for name, values in times.items()}
    expected = rows.astype(np.float64)
    mean = expected.mean(axis=0)
    for name in ("s3", "s3_npy", "s3_hdf5"):
        assert held[name].state.n_rows == n_rows
        np.testing.assert_allclose(held[name].state.mean, mean, rtol=1e-5, atol=1e-6)
    assert np.array_equal(held["s3"].state.scatter, held["local"].state.scatter) or np.allclose(
        held["s3"].state.scatter, held["local"].state.scatter, rtol=1e-6
    )
    result = {
        "rows": n_rows,
        "d": d,
        "chunk_rows": chunk_rows,
        "chunk_mib": chunk_rows * d * 4 / 2**20,
        "store_mib": n_rows * d * 4 / 2**20,
        "remote_threads": remote.REMOTE_THREADS,
        "cores": os.cpu_count(),
        "times_s": times,
    }
    table = []
    for name in functions:
        total, peak = requests.get(name, (0, 0))
        table.append(
            {
                "run": name,
                "rows_s": n_rows / best[name],
                "mib_s": n_rows * d * 4 / 2**20 / best[name],
                "requests": total or None,
                "most_in_flight": peak or None,
            }
        )
    result["table"] = table

    def ratio(a, b):
        return {
            "best": best[b] / best[a],
            "median": float(np.median([tb / ta for ta, tb in zip(times[a], times[b], strict=False)])),
        }

    result["ratios"] = {
        "s3_vs_local": ratio("s3", "local"),
        "s3_vs_dask": ratio("s3", "dask"),
        "s3_hdf5_vs_local_hdf5": ratio("s3_hdf5", "local_hdf5"),
        "s3_hdf5_vs_s3_zarr": ratio("s3_hdf5", "s3"),
        "s3_npy_vs_s3_zarr": ratio("s3_npy", "s3"),
    }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--rows", type=int, default=131_072)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--chunk-rows", type=int, default=4096, help="rows per chunk object (4096 x 768: 12 MiB)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (the best of each is kept)")
    parser.add_argument("--workdir", default=None, help="where the local stores are written (default: a temporary one)")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    missing = [name for name in ("moto", "s3fs", "dask") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"fit_remote.py needs {', '.join(missing)}: pip install -e '.[test]'", file=sys.stderr)
        return 2
    if args.quick:
        args.rows, args.dim, args.chunk_rows, args.repeats = 8192, 64, 1024, 1
    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-bench-")
    os.makedirs(directory, exist_ok=True)
    server, endpoint = start_server()
    try:
        from streamwhiten.core import stats

        stats.block_moments(np.ones((4, 4), np.float32))  # compile (or load) outside every timing
        result = measure(directory, args.rows, args.dim, args.chunk_rows, args.repeats, endpoint)
        print_table(
            f"fit from a local S3 server (moto, 127.0.0.1) vs local disk and dask.array.from_zarr + "
            f"(x.T @ x).compute(); {args.rows:,} x {args.dim} float32, chunks of {args.chunk_rows:,} rows "
            f"({result['chunk_mib']:.1f} MiB); best of {args.repeats} interleaved rounds",
            result["table"],
            ["run", "rows_s", "mib_s", "requests", "most_in_flight"],
        )
        print_table(
            "ratios (time of the reference / time of the first; median of the per-round ratios beside it)",
            [
                {"ratio": name, "best": value["best"], "median": value["median"]}
                for name, value in result["ratios"].items()
            ],
            ["ratio", "best", "median"],
        )
        save_results("fit_remote", {"result": result, "args": vars(args)}, args.results)
    finally:
        server.terminate()
        server.wait(10)
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
