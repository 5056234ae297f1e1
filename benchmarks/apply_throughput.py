"""Apply throughput against bare numpy plus writing the same bytes with the same library.

Reference, measured in the same run on the same chunks already in memory: ``(X - m) @ W`` in float32
followed by writing the result with h5py (or zarr) in the same output chunking. streamwhiten's apply
additionally reads the input store (warm page cache), checks for non-finite rows, L2-normalises and
records progress, and must stay within 0.8x of that reference (k = 256, float32 output). A second
reference also fsyncs what it wrote, as streamwhiten does before renaming an output into place. The
references write through the page cache, as h5py and zarr do; streamwhiten writes whole output chunks
around it (O_DIRECT) from a writer thread, and ``--no-direct-io`` times it writing through the page
cache too. Both write no checksums (``--checksums`` adds apply's; ``checksum_cost.py`` measures what they
cost). The references and the apply run in turn for ``--repeats`` rounds; ratios are of the
fastest run of each.

    python benchmarks/apply_throughput.py
    python benchmarks/apply_throughput.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import h5py
import numpy as np
import zarr
from _common import interleaved_times, print_table, read_all, save_results, warm_page_cache, write_tiled_store

TARGET = 0.8


def reference_run(chunks, weights, shift, path, kind, chunk_rows, durable=False):
    """The reference as a function: ``(X - m) @ W`` per chunk, written with the same library."""
    n_rows = sum(c.shape[0] for c in chunks)
    k = weights.shape[1]

    def run():
        if kind == "hdf5":
            handle = h5py.File(path, "w", rdcc_nbytes=0)
            out = handle.create_dataset("embeddings", shape=(n_rows, k), dtype="float32", chunks=(chunk_rows, k))
        else:
            handle = None
            out = zarr.create_array(
                store=path, shape=(n_rows, k), chunks=(chunk_rows, k), dtype="float32", compressors=None, overwrite=True
            )
        start = 0
        for chunk in chunks:
            out[start : start + chunk.shape[0]] = (chunk - shift) @ weights
            start += chunk.shape[0]
        if handle is not None:
            handle.close()
        if durable:  # what streamwhiten does before renaming an output into place
            files = [path] if kind == "hdf5" else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
            for name in files:
                with open(name, "rb") as raw:
                    os.fsync(raw.fileno())
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("-k", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=6, help="input chunks")
    parser.add_argument("--chunk-rows", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (the best of each is kept)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-direct-io", action="store_true", help="apply writes through the page cache too")
    parser.add_argument(
        "--checksums",
        action="store_true",
        help="apply writes its chunk checksums (the default of apply; off here, as the references write none: "
        "benchmarks/checksum_cost.py measures their cost)",
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.k, args.chunks, args.chunk_rows, args.repeats = 64, 16, 3, 2048, 1
    from streamwhiten.core.model import finalize
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.io import output_chunk_rows
    from streamwhiten.options import ApplyOptions

    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-apply-")
    os.makedirs(directory, exist_ok=True)
    try:
        n_rows = args.chunks * args.chunk_rows
        spec = write_tiled_store(os.path.join(directory, "in.h5"), n_rows, args.dim, args.chunk_rows)
        model = finalize(fit_sources(spec).state, n_components=args.k)
        data = read_all(spec)
        chunks = [np.ascontiguousarray(data[i : i + args.chunk_rows]) for i in range(0, n_rows, args.chunk_rows)]
        del data
        weights, shift = model.projection(np.float32)
        shift = shift.astype(np.float32)
        out_chunk_rows = output_chunk_rows(args.k, np.float32, n_rows)
        warm_page_cache(spec.split(":")[0])
        warmup = os.path.join(directory, "warmup.zarr")
        apply_model(model, spec, warmup, ApplyOptions(normalize=True, overwrite=True))  # kernels compiled
        shutil.rmtree(warmup)
        rows_out = []
        for kind, name in (("hdf5", "out.h5"), ("zarr", "out.zarr")):
            target = os.path.join(directory, name)

            def ours():
                options = ApplyOptions(
                    normalize=True, overwrite=True, direct_io=not args.no_direct_io, checksums=args.checksums
                )
                apply_model(model, spec, target, options=options)
                shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)

            times = interleaved_times(
                {
                    "reference": reference_run(chunks, weights, shift, target, kind, out_chunk_rows),
                    "reference_fsync": reference_run(
                        chunks, weights, shift, target, kind, out_chunk_rows, durable=True
                    ),
                    "apply": ours,
                },
                args.repeats,
            )
            reference, durable, seconds = (min(times[name]) for name in ("reference", "reference_fsync", "apply"))
            per_round = [r / a for r, a in zip(times["reference"], times["apply"], strict=False)]
            rows_out.append(
                {
                    "output": kind,
                    "direct_io": not args.no_direct_io,
                    "rows": n_rows,
                    "d": args.dim,
                    "k": args.k,
                    "reference_rows_s": n_rows / reference,
                    "apply_rows_s": n_rows / seconds,
                    "ratio": reference / seconds,
                    "ratio_median": float(np.median(per_round)),
                    "meets_0.8": reference / seconds >= TARGET,
                    "reference_fsync_rows_s": n_rows / durable,
                    "ratio_vs_fsync": durable / seconds,
                    "times_s": times,
                }
            )
        print_table(
            f"apply (k = {args.k}, L2-normalised, float32) vs (X - m) @ W + the same write (target >= {TARGET}x)",
            rows_out,
            [
                "output",
                "direct_io",
                "rows",
                "d",
                "k",
                "reference_rows_s",
                "apply_rows_s",
                "ratio",
                "ratio_median",
                "meets_0.8",
                "reference_fsync_rows_s",
                "ratio_vs_fsync",
            ],
        )
        print(
            f"(best of {args.repeats} interleaved rounds; ratio_median: the median of the per-round ratios. "
            "reference_fsync: the same reference, also fsyncing what it wrote, as streamwhiten does before it "
            "renames a finished output into place)"
        )
        save_results("apply_throughput", {"rows": rows_out, "args": vars(args)}, args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
