"""Damaged chunks of input stores (issue #14, "nothing lost, nothing silently wrong").

Every kind of store the README accepts -- HDF5 chunked (uncompressed and gzip), Zarr v3 (uncompressed and
the default zstd), Zarr v2 (the default zstd, and uncompressed) and .npy -- is damaged the ways a disk,
a copy or an interrupted writer damage them:

- a missing chunk: a Zarr chunk file deleted; for HDF5 a chunked dataset of which one chunk was never
  written (unallocated);
- a truncated chunk: a Zarr chunk file cut in half; an HDF5 file cut off inside a chunk's data;
- garbage in a compressed chunk: its bytes overwritten with random ones;
- a shrunk file: an .h5 or .npy file cut to half its size.

``fit``, ``apply`` and ``Whitener().fit(spec)`` must refuse each one: exit 2 (``BadInputError``) with one
line on stderr naming the store -- and, for a missing chunk, the rows the chunk covers -- with no
RuntimeWarning or other extra line, and without leaving a model, an output or a hidden partial file.
Finite garbage inside an *uncompressed* chunk cannot be told from data (there is no checksum), so it is
not among the cases -- except where a checksum guards the chunk (HDF5 fletcher32, Zarr 3 crc32c): there
a few flipped bits in a chunk ("flipped-bits") must be refused too. Compressed chunks are decoded by
streamwhiten itself (``io.codecs``), so every codec it decodes is among the kinds: zstd, blosc and gzip
in Zarr (v2 and v3), deflate + shuffle, fletcher32, LZF and the blosc and zstd plugin filters in HDF5.

A missing Zarr chunk may be read as the array's fill value only when asked: ``--fill-missing-chunks``
on ``fit``/``apply``, ``Whitener(read=ReadOptions(fill_missing_chunks=True))``.
"""

from __future__ import annotations

import os
import re
import warnings

import h5py
import numpy as np
import pytest
import zarr
from conftest import anisotropic, run_command

ROWS, FEATURES, CHUNK = 1000, 16, 100
BROKEN = 2  # index of the damaged chunk: rows 200..299
FIRST, LAST = BROKEN * CHUNK, (BROKEN + 1) * CHUNK - 1


#: store kind -> how it is written
def _zarr3_codecs(name):
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec

    return {
        "blosc": [BloscCodec(cname="lz4", shuffle="shuffle")],
        "crc32c": [Crc32cCodec()],
        "gzip-crc32c": [GzipCodec(level=3), Crc32cCodec()],
    }[name]


def _hdf5_plugin(name):
    import hdf5plugin

    return dict(
        hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
        if name == "blosc"
        else hdf5plugin.Zstd()
    )


KINDS = {
    "h5": {"format": "hdf5", "compression": None},
    "h5-gzip": {"format": "hdf5", "compression": "gzip"},
    "h5-gzip-shuffle-fletcher32": {
        "format": "hdf5",
        "options": {"compression": "gzip", "shuffle": True, "fletcher32": True},
    },
    "h5-fletcher32": {"format": "hdf5", "options": {"fletcher32": True}},
    "h5-lzf": {"format": "hdf5", "options": {"compression": "lzf"}},
    "h5-blosc": {"format": "hdf5", "plugin": "blosc"},
    "h5-zstd": {"format": "hdf5", "plugin": "zstd"},
    "zarr3": {"format": "zarr", "zarr_format": 3, "compressed": False},
    "zarr3-zstd": {"format": "zarr", "zarr_format": 3, "compressed": True},
    "zarr3-blosc": {"format": "zarr", "zarr_format": 3, "codecs": "blosc"},
    "zarr3-crc32c": {"format": "zarr", "zarr_format": 3, "codecs": "crc32c"},
    "zarr3-gzip-crc32c": {"format": "zarr", "zarr_format": 3, "codecs": "gzip-crc32c"},
    "zarr2": {"format": "zarr", "zarr_format": 2, "compressed": True},  # zarr's default v2 compressor (zstd)
    "zarr2-raw": {"format": "zarr", "zarr_format": 2, "compressed": False},
    "npy": {"format": "npy"},
}
COMPRESSED = [
    "h5-gzip",
    "h5-lzf",
    "h5-gzip-shuffle-fletcher32",
    "h5-blosc",
    "h5-zstd",
    "zarr3-zstd",
    "zarr3-blosc",
    "zarr3-gzip-crc32c",
    "zarr2",
]
CHECKSUMMED = ["h5-fletcher32", "h5-gzip-shuffle-fletcher32", "zarr3-crc32c", "zarr3-gzip-crc32c"]
CHUNKED = [kind for kind in KINDS if kind != "npy"]
ZARR = [kind for kind in KINDS if kind.startswith("zarr")]

DAMAGES = {
    "missing-chunk": CHUNKED,
    "truncated-chunk": CHUNKED,
    "garbage-chunk": COMPRESSED
    + ["zarr3-crc32c", "h5-fletcher32"],  # finite garbage in an unchecked raw chunk is undetectable
    "flipped-bits": CHECKSUMMED,  # the chunk still decodes: only its checksum can tell
    "shrunk-file": ["h5", "h5-gzip", "npy"],
}
CASES = [(kind, damage) for damage, kinds in DAMAGES.items() for kind in kinds]


@pytest.fixture(scope="module")
def rows():
    return anisotropic(ROWS, FEATURES, seed=21).astype(np.float32)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, rows):
    """A model of the right width, fitted on intact rows, kept away from the damaged stores."""
    from streamwhiten import Whitener

    path = tmp_path_factory.mktemp("model") / "model.npz"
    Whitener(n_components=8).fit(rows).save(str(path))
    return str(path)


def store_name(kind: str) -> str:
    return {"hdf5": "in.h5", "zarr": "in.zarr", "npy": "in.npy"}[KINDS[kind]["format"]]


def write_store(directory, kind: str, rows: np.ndarray, skip_chunk: int | None = None) -> tuple[str, str]:
    """Write ``rows`` as a store of ``kind`` in ``directory``; ``(spec, path)``. With ``skip_chunk`` that
    chunk is never written (HDF5: left unallocated; Zarr: its file removed afterwards)."""
    how = KINDS[kind]
    path = os.path.join(str(directory), store_name(kind))
    if how["format"] == "npy":
        np.save(path, rows)
        return path, path
    if how["format"] == "hdf5":
        if kind == "h5-lzf":  # LZF is optional in HDF5: rows it cannot shrink would be stored raw
            rows = (np.round(rows.astype(np.float64) * 4) / 4).astype(rows.dtype)
        options = (
            _hdf5_plugin(how["plugin"])
            if "plugin" in how
            else how.get("options", {"compression": how.get("compression")})
        )
        with h5py.File(path, "w") as handle:
            dataset = handle.create_dataset(
                "emb", shape=rows.shape, dtype=rows.dtype, chunks=(CHUNK, FEATURES), **options
            )
            for index in range(-(-rows.shape[0] // CHUNK)):
                if index != skip_chunk:
                    dataset[index * CHUNK : (index + 1) * CHUNK] = rows[index * CHUNK : (index + 1) * CHUNK]
            if kind == "h5-lzf":  # every chunk compressed, so that the damage reaches the LZF decoder
                masks = {dataset.id.get_chunk_info(i).filter_mask for i in range(dataset.id.get_num_chunks())}
                assert masks == {0}, masks
        return f"{path}:/emb", path
    if "codecs" in how:
        codecs = {"compressors": _zarr3_codecs(how["codecs"])}
    else:
        codecs = {} if how["compressed"] else {"compressors": None}
    array = zarr.create_array(
        store=path,
        shape=rows.shape,
        chunks=(CHUNK, FEATURES),
        dtype=rows.dtype,
        zarr_format=how["zarr_format"],
        **codecs,
    )
    array[...] = rows
    if skip_chunk is not None:
        os.remove(zarr_chunk_file(path, kind, skip_chunk))
    return path, path


def zarr_chunk_file(path: str, kind: str, index: int) -> str:
    if KINDS[kind]["zarr_format"] == 3:
        return os.path.join(path, "c", str(index), "0")
    return os.path.join(path, f"{index}.0")


def hdf5_chunk(path: str, index: int):
    with h5py.File(path, "r") as handle:
        info = handle["emb"].id.get_chunk_info_by_coord((index * CHUNK, 0))
    assert info.byte_offset is not None, "the chunk to damage was never written"
    return info.byte_offset, info.size


def damaged_store(directory, kind: str, damage: str, rows: np.ndarray) -> tuple[str, str]:
    """Write a store of ``kind`` and damage it; ``(spec, path)``."""
    if damage == "missing-chunk":
        return write_store(directory, kind, rows, skip_chunk=BROKEN)
    spec, path = write_store(directory, kind, rows)
    rng = np.random.default_rng(1414)
    fmt = KINDS[kind]["format"]
    if damage == "shrunk-file":
        os.truncate(path, os.path.getsize(path) // 2)
    elif damage == "truncated-chunk" and fmt == "zarr":
        chunk = zarr_chunk_file(path, kind, BROKEN)
        os.truncate(chunk, os.path.getsize(chunk) // 2)
    elif damage == "truncated-chunk":  # the file ends inside the chunk's data
        offset, size = hdf5_chunk(path, BROKEN)
        os.truncate(path, offset + size // 2)
    elif damage == "flipped-bits":  # a few bits in the middle of the chunk: it still decodes, to other values
        if fmt == "zarr":
            offset, size, target = (
                0,
                os.path.getsize(zarr_chunk_file(path, kind, BROKEN)),
                zarr_chunk_file(path, kind, BROKEN),
            )
        else:
            (offset, size), target = hdf5_chunk(path, BROKEN), path
        with open(target, "r+b") as handle:
            handle.seek(offset + size // 2)
            byte = handle.read(1)
            handle.seek(offset + size // 2)
            handle.write(bytes([byte[0] ^ 0x10]))
    elif damage == "garbage-chunk":
        # Random bytes after a header that no codec accepts (zlib: invalid method; zstd: no frame magic).
        if fmt == "zarr":
            chunk = zarr_chunk_file(path, kind, BROKEN)
            size = os.path.getsize(chunk)
            with open(chunk, "r+b") as handle:
                handle.write(b"\xff\xff" + rng.bytes(size - 2))
        else:
            offset, size = hdf5_chunk(path, BROKEN)
            with open(path, "r+b") as handle:
                handle.seek(offset)
                handle.write(b"\xff\xff" + rng.bytes(size - 2))
    else:
        raise AssertionError(damage)
    return spec, path


def one_error_line(result, *, expect_code: int = 2) -> tuple[list, str]:
    """Problems with a failed CLI run's exit code and stderr; and its single line."""
    problems = []
    if result.returncode != expect_code:
        problems.append(f"exit code {result.returncode}, expected {expect_code}")
    lines = result.stderr.splitlines()
    if len(lines) != 1 or not lines[0].startswith("streamwhiten: error:"):
        problems.append(f"stderr should be exactly one line 'streamwhiten: error: ...', got {lines!r}")
    for marker in ("Traceback", "internal error", "Warning", "Exception ignored"):
        if marker in result.stderr:
            problems.append(f"stderr contains {marker!r}")
    ours = [line for line in lines if line.startswith("streamwhiten:")]
    return problems, (ours[0] if ours else "")


def names_the_damage(message: str, kind: str, damage: str) -> list:
    problems = []
    if store_name(kind) not in message:
        problems.append(f"the message does not name the store {store_name(kind)!r}")
    if damage == "missing-chunk" and not (
        re.search(rf"\b{FIRST}\b", message) and re.search(rf"\b({LAST}|{LAST + 1})\b", message)
    ):
        problems.append(f"the message does not name the rows {FIRST}..{LAST} the missing chunk covers")
    return problems


@pytest.mark.parametrize("kind, damage", CASES, ids=[f"{damage}-{kind}" for kind, damage in CASES])
@pytest.mark.parametrize("command", ["fit", "apply"])
def test_cli_refuses_damaged_store(tmp_path, rows, model_path, kind, damage, command):
    spec, _ = damaged_store(tmp_path, kind, damage, rows)
    before = sorted(os.listdir(tmp_path))
    if command == "fit":
        result = run_command("fit", spec, "-o", tmp_path / "model.npz", "-q")
    else:
        result = run_command("apply", model_path, spec, "-o", f"{tmp_path / 'out.h5'}:/y", "-q")
    problems, line = one_error_line(result)
    if result.returncode != 0:
        problems += names_the_damage(line, kind, damage)
    left = sorted(os.listdir(tmp_path))
    if left != before:
        problems.append(f"files left behind: {sorted(set(left) - set(before))}")
    assert not problems, (
        f"{command} on a store ({kind}) with a {damage}: "
        + "; ".join(problems)
        + f"\nexit {result.returncode}, stderr: {result.stderr!r}"
    )


@pytest.mark.parametrize("kind, damage", CASES, ids=[f"{damage}-{kind}" for kind, damage in CASES])
def test_api_fit_refuses_damaged_store(tmp_path, rows, kind, damage):
    from streamwhiten import Whitener
    from streamwhiten.errors import EXIT_BAD_INPUT, StreamwhitenError

    spec, _ = damaged_store(tmp_path, kind, damage, rows)
    before = sorted(os.listdir(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            Whitener().fit(spec)
        except StreamwhitenError as exc:
            error = exc
        else:
            error = None
    problems = []
    if error is None:
        problems.append("Whitener().fit returned without an error")
    else:
        if error.exit_code != EXIT_BAD_INPUT:
            problems.append(f"{type(error).__name__} (exit code {error.exit_code}), expected a BadInputError (exit 2)")
        problems += names_the_damage(str(error), kind, damage)
    runtime = [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, RuntimeWarning)]
    if runtime:
        problems.append(f"warnings raised: {runtime[:3]}")
    if sorted(os.listdir(tmp_path)) != before:
        problems.append(f"files left behind: {sorted(set(os.listdir(tmp_path)) - set(before))}")
    assert not problems, (
        f"Whitener().fit on a store ({kind}) with a {damage}: "
        + "; ".join(problems)
        + (f"\nerror: {type(error).__name__}: {error}" if error is not None else "")
    )


# ---------------------------------------------------------------------- reading holes as the fill value


@pytest.fixture
def holed(tmp_path, rows, request):
    """A Zarr store missing chunk 2, and an HDF5 store holding the same rows with that chunk's rows set to
    the fill value (0), chunked alike: what ``--fill-missing-chunks`` must read."""
    (tmp_path / "holed").mkdir()
    spec, _ = write_store(tmp_path / "holed", request.param, rows, skip_chunk=BROKEN)
    filled = rows.copy()
    filled[FIRST : LAST + 1] = 0.0
    (tmp_path / "filled").mkdir()
    reference, _ = write_store(tmp_path / "filled", "h5", filled)
    return spec, reference, filled


@pytest.mark.parametrize("holed", ZARR, indirect=True)
def test_fill_missing_chunks_fit_and_apply(tmp_path, holed, model_path):
    from streamwhiten.core.model import load_model

    spec, reference, _ = holed
    fitted = run_command("fit", spec, "-o", tmp_path / "m.npz", "-q", "--fill-missing-chunks")
    assert fitted.returncode == 0 and not fitted.stderr, fitted.stderr
    assert run_command("fit", reference, "-o", tmp_path / "ref.npz", "-q").returncode == 0
    model, expected = load_model(str(tmp_path / "m.npz")), load_model(str(tmp_path / "ref.npz"))
    assert model.n_rows == expected.n_rows == ROWS
    np.testing.assert_allclose(model.state.mean, expected.state.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.state.scatter, expected.state.scatter, rtol=1e-10, atol=1e-9)

    applied = run_command("apply", model_path, spec, "-o", f"{tmp_path / 'out.h5'}:/y", "-q", "--fill-missing-chunks")
    assert applied.returncode == 0 and not applied.stderr, applied.stderr
    assert run_command("apply", model_path, reference, "-o", f"{tmp_path / 'ref.h5'}:/y", "-q").returncode == 0
    with h5py.File(tmp_path / "out.h5", "r") as out, h5py.File(tmp_path / "ref.h5", "r") as ref:
        np.testing.assert_allclose(out["y"][...], ref["y"][...], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("holed", ["zarr3", "zarr3-zstd"], indirect=True)
def test_fill_missing_chunks_api(holed):
    from streamwhiten import ReadOptions, Whitener

    spec, _, filled = holed
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fitted = Whitener(read=ReadOptions(fill_missing_chunks=True)).fit(spec)
    expected = Whitener().fit(filled)
    assert fitted.n_samples_seen_ == ROWS
    np.testing.assert_allclose(fitted.mean_, expected.mean_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fitted.covariance_, expected.covariance_, rtol=1e-6, atol=1e-9)


def test_fill_missing_chunks_does_not_hide_other_damage(tmp_path, rows):
    spec, _ = damaged_store(tmp_path, "zarr3-zstd", "garbage-chunk", rows)
    result = run_command("fit", spec, "-o", tmp_path / "m.npz", "-q", "--fill-missing-chunks")
    problems, line = one_error_line(result)
    problems += names_the_damage(line, "zarr3-zstd", "garbage-chunk")
    assert not problems and not (tmp_path / "m.npz").exists(), "; ".join(problems) + f"\n{result.stderr!r}"
