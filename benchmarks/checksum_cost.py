"""What the output checksums cost (issue #36): apply, reading an output back, and an appending night,
each with and without checksums, in the same run.

Outputs carry a checksum per chunk by default (``checksums``, ``--no-checksums``): HDF5's fletcher32
filter (numcodecs computes it in the writer thread, and the reader checks it as it decodes), Zarr 3's
crc32c codec (google-crc32c, hardware CRC). Parquet pages always carry their CRC (not switchable here) and
Lance has none. For each output kind the apply of the same model to the same input runs with and without
checksums in interleaved rounds (the fastest of each kept), then the output of each is read back whole
through ``open_source`` (which verifies the checksums); ``ratio`` is seconds with / seconds without.

The night: two ``[publish]`` jobs over the same shards (the generator of ``nightly_cost.py``), one with
``checksums = false`` in ``[apply]``; after night 0 each later night appends ``--night-rows`` rows to the
latest shard and both jobs run it (in turn, the order alternating): an appending night's wall time with
checksums / without.

    python benchmarks/checksum_cost.py
    python benchmarks/checksum_cost.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from _common import interleaved_times, print_table, save_results, warm_page_cache, write_tiled_store
from nightly_cost import Corpus, run_night

#: output kind -> (file name, apply options)
KINDS = {
    "hdf5": ("out.h5", {}),
    "hdf5 gzip": ("out-gzip.h5", {"compressor": "gzip"}),
    "zarr": ("out.zarr", {}),
    "zarr zstd": ("out-zstd.zarr", {"compressor": "zstd"}),
}


def read_back(path: str) -> None:
    """Read the whole output through streamwhiten's reader, block by block (checksums verified)."""
    from streamwhiten.io import open_source

    with open_source(path) as source:
        for start, stop in source.blocks(source.default_block_rows()):
            source.read(start, stop)


def apply_rows(args, directory: str) -> list:
    from streamwhiten.core.model import finalize
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.options import ApplyOptions

    n_rows = args.chunks * args.chunk_rows
    spec = write_tiled_store(os.path.join(directory, "in.h5"), n_rows, args.dim, args.chunk_rows)
    model = finalize(fit_sources(spec).state, n_components=args.k)
    warm_page_cache(spec.split(":")[0])
    warmup = os.path.join(directory, "warmup.zarr")
    apply_model(model, spec, warmup, options=ApplyOptions(normalize=True, overwrite=True))  # kernels compiled
    shutil.rmtree(warmup)
    rows = []
    for kind, (name, extra) in KINDS.items():
        targets = {on: os.path.join(directory, ("with-" if on else "without-") + name) for on in (True, False)}

        def writer(on, extra=extra, targets=targets):
            options = ApplyOptions(normalize=True, overwrite=True, checksums=on, **extra)
            return lambda: apply_model(model, spec, targets[on], options=options)

        def reader(on, targets=targets):
            return lambda: read_back(targets[on])

        writes = interleaved_times({"with": writer(True), "without": writer(False)}, args.repeats)
        reads = interleaved_times({"with": reader(True), "without": reader(False)}, args.repeats)
        write_with, write_without = min(writes["with"]), min(writes["without"])
        read_with, read_without = min(reads["with"]), min(reads["without"])
        rows.append(
            {
                "output": kind,
                "rows": n_rows,
                "d": args.dim,
                "k": args.k,
                "apply_rows_s": n_rows / write_with,
                "apply_rows_s_without": n_rows / write_without,
                "apply_ratio": write_with / write_without,
                "read_rows_s": n_rows / read_with,
                "read_rows_s_without": n_rows / read_without,
                "read_ratio": read_with / read_without,
                "times_s": {"apply": writes, "read": reads},
            }
        )
        for target in targets.values():
            shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    return rows


def write_job(directory: str, shards: str, checksums: bool) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "job.toml")
    with open(path, "w") as handle:
        handle.write(
            f'name = "nightly"\n[input]\npaths = ["{shards}/day-*.h5"]\n[model]\npath = "models/m.npz"\n'
            f'[apply]\noutput = "out/{{stem}}.h5"\nchecksums = {str(checksums).lower()}\n[publish]\n'
        )
    return path


def night_rows(args, directory: str) -> list:
    corpus = Corpus(os.path.join(directory, "shards"), args.dim, mean_drift=0.0, cov_drift=0.0)
    jobs = {on: write_job(os.path.join(directory, f"job-{on}"), corpus.directory, on) for on in (True, False)}
    corpus.add(args.first_rows, 0, new_shard=True)
    for job in jobs.values():
        run_night(job)
    rows = []
    for night in range(1, args.nights + 1):
        corpus.add(args.night_rows, night, new_shard=False)
        order = (True, False) if night % 2 else (False, True)
        reports = {on: run_night(jobs[on]) for on in order}
        rows.append(
            {
                "night": night,
                "new_rows": args.night_rows,
                "action": reports[True]["action"],
                "action_without": reports[False]["action"],
                "seconds": reports[True]["wall_s"],
                "seconds_without": reports[False]["wall_s"],
                "ratio": reports[True]["wall_s"] / reports[False]["wall_s"],
            }
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("-k", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=4, help="input chunks of the apply")
    parser.add_argument("--chunk-rows", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (the best of each is kept)")
    parser.add_argument("--first-rows", type=int, default=200_000, help="rows of night 0")
    parser.add_argument("--night-rows", type=int, default=40_000, help="rows appended each later night")
    parser.add_argument("--nights", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.k, args.chunks, args.chunk_rows, args.repeats = 64, 16, 3, 2048, 1
        args.first_rows, args.night_rows, args.nights = 6000, 1000, 2
    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-checksums-")
    os.makedirs(directory, exist_ok=True)
    began = time.perf_counter()
    try:
        applied = apply_rows(args, directory)
        nights = night_rows(args, directory)
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print_table(
        f"apply and read back (k = {args.k}, float32), with checksums vs without (ratio: seconds with / without)",
        applied,
        [
            "output",
            "rows",
            "d",
            "k",
            "apply_rows_s",
            "apply_rows_s_without",
            "apply_ratio",
            "read_rows_s",
            "read_rows_s_without",
            "read_ratio",
        ],
    )
    if nights:
        print_table(
            "appending nights of a [publish] job (HDF5 parts), with checksums vs without",
            nights,
            ["night", "new_rows", "action", "action_without", "seconds", "seconds_without", "ratio"],
        )
    appending = [row["ratio"] for row in nights if row["action"] == row["action_without"] == "append"]
    summary = {"night_ratio_median": float(np.median(appending)) if appending else None}
    print(f"(best of {args.repeats} interleaved rounds per apply and read; median night ratio {summary})")
    save_results(
        "checksum_cost",
        {"apply": applied, "nights": nights, "summary": summary, "args": vars(args),
         "seconds": time.perf_counter() - began},
        args.results,
    )  # fmt: skip


if __name__ == "__main__":
    main()
