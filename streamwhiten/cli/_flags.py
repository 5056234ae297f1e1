"""The command line's words for the library's parameters: each option's flags and help, and
`cli_message`, which rewrites the parameters a library error names (``keep_columns``) as flags
(``--keep-columns``): the library never names a flag.
"""

from __future__ import annotations

import re
from functools import partial

from ..errors import StreamwhitenError
from ..params import MAX_WORKERS

#: Flags other than ``--name-with-dashes``: a short form, or a name the command line spells otherwise.
FLAGS: dict[str, tuple[str, ...]] = {
    "n_components": ("-k", "--n-components"),
    "storage_options": ("--storage-option",),
    "fmt": ("--format",),
}

#: Booleans on by default: an ``--x/--no-x`` pair, not a lone flag.
SWITCHES = ("direct_io", "checksums")

#: Each parameter's help in ``--help`` (and the job-file reference, docs/job-file.md).
HELP: dict[str, str] = {
    "beta": "Mean removal in [0, 1] (1: centre, 0: rotate about 0).",
    "gamma": "Whitening strength in [0, 1] (1: unit variance, 0: rotation).",
    "n_components": "Kept dimensions k.",
    "variance": "Keep the fewest components explaining this fraction of the variance, e.g. 0.99.",
    "eps": "Regulariser relative to the largest eigenvalue.",
    "normalize": "Scale every output row to unit L2 norm.",
    "precision": "Arithmetic of the scatter product (auto: float64 for float64 stores, else float32).",
    "skip_nonfinite": "Skip and count rows holding NaN/Inf instead of failing.",
    "fill_missing_chunks": (
        "Read chunks missing from an input store (Zarr) or never written (HDF5) as the array's fill value. "
        "Without it such a store is refused: a hole is usually a damaged or half-copied store."
    ),
    "block_rows": (
        "Rows per block the engine reads and reduces (default: whole store chunks, about 64 MiB; a value "
        "above the input's rows reads it as one block)."
    ),
    "threads": (
        "Serial engine: worker threads, each doing whole blocks (fit default: one per core, at most 4; apply "
        f"default: 1; -1: one per core; at most {MAX_WORKERS}). Memory is about one block per thread."
    ),
    "checkpoint_every": "Checkpoint every N blocks.",
    "checkpoint_seconds": "... or every T seconds.",
    "progress_seconds": (
        "Make the rows written durable and record them for a resume every T seconds (0: every block)."
    ),
    "dtype": (
        "How the vectors are stored: float32 or float16 values, int8 codes (a scale and offset per component,"
        " from the statistics) or sign bits (8 per byte). None: the model's storage (what tune chose), else "
        "float32."
    ),
    "zarr_format": "The format of a Zarr output.",
    "direct_io": (
        "Serial engine: write whole output chunks around the page cache (O_DIRECT, where the file system "
        "allows it; the default): no CPU spent copying, and the cached input is left alone. --no-direct-io "
        "leaves the output in the page cache, e.g. for a program that reads it right after."
    ),
    "compressor": (
        "Serial engine, HDF5 or Zarr output: compress each output chunk in the writer thread (zstd level 3, "
        "blosc lz4 level 5 with byte shuffle, or gzip level 4 with shuffle on HDF5), readable by plain zarr "
        "and h5py (HDF5 zstd and blosc: with hdf5plugin installed)."
    ),
    "checksums": (
        "Store a checksum with every output chunk, verified whenever it is read (the default): HDF5's "
        "fletcher32 filter, Zarr 3's crc32c codec; Parquet pages always carry theirs (Zarr 2 and Lance have "
        "none). Flipped bits in an output are then refused, never read as values. --no-checksums saves their "
        "cost (docs/performance.md)."
    ),
    "keep_columns": (
        "Copy these comma-separated input columns (Parquet or Lance input) into the Parquet or Lance output, "
        "row for row beside the vectors, e.g. --keep-columns id,url."
    ),
    "remote_timeout": (
        "Seconds an object store may keep failing (refusing connections, timing out, or not answering) before"
        " the command gives up, exit 74 [default: 10, or STREAMWHITEN_REMOTE_TIMEOUT]."
    ),
    "workers": "With --engine dask and no --scheduler: processes of the local cluster (default: one per core).",
    "max_staleness": (
        "Tolerance of the staleness total: above it, run publishes a new version (docs/nightly.md); inf: "
        "never republish because of staleness."
    ),
    "keep_versions": (
        "Published versions kept on disk, the current one included; older ones are deleted after a new one is"
        " published."
    ),
    "int8_clip": "int8: the codes span each component's mean +- this many standard deviations.",
    "rescore": (
        "With --dtype binary: re-rank the top N of the bit search with --rescore-dtype vectors (0: none; more"
        " than the corpus's rows re-ranks all of them)."
    ),
    "rescore_dtype": "The vectors a --rescore re-ranks with (they are read from disk: their bytes count).",
    "bootstrap": "Resamples of the queries for the paired 95% interval of each difference (0: none).",
    "seed": "Seed of the bootstrap's resampling.",
    "storage_options": (
        "An option of the file system of s3://, gs://, https:// ... inputs and outputs (repeatable), passed "
        "to fsspec, e.g. endpoint_url=http://127.0.0.1:9000 or anon=true; values are JSON where they parse. The "
        "standard environment (AWS_ENDPOINT_URL, AWS_PROFILE, ...) applies too. Never printed or recorded."
    ),
    "max_bytes": (
        "Choose among the settings storing at most this many bytes per corpus vector (bits plus the vectors a"
        " rescoring reads). Default: no budget."
    ),
}


def flags(name: str) -> tuple[str, ...]:
    """The command-line spelling of parameter ``name``: its `FLAGS`, else ``--name-with-dashes``."""
    return FLAGS.get(name) or ("--" + name.replace("_", "-"),)


def flag(name: str) -> str:
    """The long flag of parameter ``name`` (``--n-components``, ``--keep-columns``)."""
    return flags(name)[-1]


def _option(name: str, value: str | None) -> str:
    """How the command line gives parameter ``name`` the value written ``value`` in Python (None: none)."""
    if not value and name in SWITCHES:
        return f"{flag(name)}/--no-{flag(name)[2:]}"
    if not value or value == "True":
        return flag(name)
    if value == "False":
        return "--no-" + flag(name)[2:]
    return f"{flag(name)} {value.strip(chr(39))}"


def _replace(name: str, match: re.Match[str]) -> str:
    return _option(name, match.group(1))


def _named(exc: BaseException) -> list[str]:
    """The parameters ``exc`` names, and those of the wrapped errors whose message it repeats."""
    seen = list(exc.params) if isinstance(exc, StreamwhitenError) else []
    text, inner, steps = str(exc), exc.__cause__ or exc.__context__, 0
    while inner is not None and steps < 20 and str(inner) and str(inner) in text:
        if isinstance(inner, StreamwhitenError):
            seen.extend(inner.params)
        inner, steps = inner.__cause__ or inner.__context__, steps + 1
    return seen


def cli_message(exc: BaseException) -> str:
    """The message of ``exc`` with every parameter it names written as its option (``overwrite=True``:
    ``--overwrite``, ``precision='float64'``: ``--precision float64``)."""
    text = str(exc)
    for name in dict.fromkeys(_named(exc)):
        # where the message gives it a value (``dataset='emb'``), only that form names it: the bare word is prose
        value = "=('[^']*'|[\\w.+-]+)" if re.search(rf"(?<![\w.+-]){re.escape(name)}=", text) else "()?"
        pattern = re.compile(rf"(?<![\w.+-]){re.escape(name)}{value}(?![\w-])")
        text = pattern.sub(partial(_replace, name), text)
    return text


__all__ = ["FLAGS", "HELP", "SWITCHES", "cli_message", "flag", "flags"]
