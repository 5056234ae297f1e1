"""Input stores whose metadata or header is damaged or lies (issues #23, #36): a Zarr chunk that is a
directory, Zarr metadata no writer could have written, .npy and .npz headers declaring more than the file
holds, .npy format versions, flipped bytes in an HDF5 file's metadata, and HDF5 errors carrying a system
errno. Each is refused in one line naming the store (exit 2; 74 for a failed system call), never an
internal error, with the user's files as they were."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from conftest import run_command, write_h5, write_zarr
from user_files import SMALL, run_checked


def test_a_zarr_chunk_replaced_by_a_directory_is_damaged_data(tmp_path):
    write_zarr(tmp_path / "z.zarr", SMALL)
    os.remove(tmp_path / "z.zarr" / "c" / "2" / "0")
    os.mkdir(tmp_path / "z.zarr" / "c" / "2" / "0")
    pattern = r"z\.zarr: chunk c/2/0 \(rows 200\.\.299\) is a directory, not a chunk file"
    run_checked(tmp_path, ["fit", "z.zarr", "-o", "m.npz"], 2, pattern)


def _edit_json(path, edit) -> None:

    with open(path) as handle:
        meta = json.load(handle)
    edit(meta)
    with open(path, "w") as handle:
        json.dump(meta, handle)


ZARR_METADATA_DAMAGE = {
    # a chunk length of 0 (zarr reads it; the rows of a chunk would be divided by it)
    "chunk-0-v3": (3, lambda m: m["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(0, 0), r"chunk shape"),
    "chunk-0-v2": (2, lambda m: m["chunks"].__setitem__(0, 0), r"chunk shape"),
    # a width whose d x d statistics no machine holds (a damaged number; the sampled rows would be allocated)
    "width-v3": (
        3,
        lambda m: (
            m["shape"].__setitem__(1, 10**9),
            m["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(1, 10**9),
        ),
        r"1,000,000,000 columns",
    ),
    "width-v2": (
        2,
        lambda m: (m["shape"].__setitem__(1, 10**9), m["chunks"].__setitem__(1, 10**9)),
        r"1,000,000,000 columns",
    ),
    # more rows than there are chunks for: the first chunk not there is refused, not read as zeros
    "rows-v3": (3, lambda m: m["shape"].__setitem__(0, 10**15), r"chunk c/4/0 \(rows 400\.\.499\) is missing"),
    "rows-v2": (2, lambda m: m["shape"].__setitem__(0, 10**15), r"chunk 4\.0 \(rows 400\.\.499\) is missing"),
    "negative-v3": (3, lambda m: m["shape"].__setitem__(0, -5), r"metadata"),
    "negative-v2": (2, lambda m: m["shape"].__setitem__(0, -5), r"metadata"),
}


@pytest.mark.parametrize("case", ZARR_METADATA_DAMAGE)
def test_zarr_metadata_that_could_not_have_been_written_is_refused(tmp_path, case):
    zarr_format, edit, pattern = ZARR_METADATA_DAMAGE[case]
    write_zarr(tmp_path / "z.zarr", SMALL, zarr_format=zarr_format)
    _edit_json(tmp_path / "z.zarr" / ("zarr.json" if zarr_format == 3 else ".zarray"), edit)
    run_checked(tmp_path, ["fit", "z.zarr", "-o", "m.npz"], 2, rf"^streamwhiten: error: z\.zarr: .*{pattern}")


def _npy_with_header(path, shape, data=b"\0" * 16) -> None:
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": shape})
        handle.write(data)


def _npz_with_absurd_member(source, target, member="mean.npy", shape=(10**11,)) -> None:
    """``source`` (an .npz) copied to ``target`` with ``member``'s header declaring ``shape``: numpy would
    allocate what the header says (745 GiB for a model's mean) before finding the data short."""
    import io
    import zipfile

    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == member:
                handle = io.BytesIO(data)
                np.lib.format.read_magic(handle)
                _, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": shape}
                )
                data = header.getvalue() + data[handle.tell() :]
            zout.writestr(info.filename, data)


def test_npy_and_npz_headers_that_declare_more_than_the_file_holds_are_refused(tmp_path, small_model):
    (tmp_path / "good.npz").write_bytes(small_model)
    _npz_with_absurd_member(tmp_path / "good.npz", tmp_path / "model.npz")
    write_h5(tmp_path / "g.h5", SMALL)
    _npy_with_header(tmp_path / "huge.npy", (10**11, 8))
    _npy_with_header(tmp_path / "negative.npy", (-5, 4))
    _npy_with_header(tmp_path / "scores.npy", (10**11,))
    (tmp_path / "empty.npy").write_bytes(b"")
    corrupt = r"model\.npz: model file is corrupt: its member mean\.npy .*declares shape \(100000000000,\)"
    run_checked(tmp_path, ["info", "model.npz"], 2, corrupt)
    run_checked(tmp_path, ["apply", "model.npz", "g.h5", "-o", "o.zarr"], 2, corrupt)
    run_checked(tmp_path, ["export", "model.npz", "-o", "map.npz"], 2, corrupt)
    run_checked(tmp_path, ["fit", "huge.npy", "-o", "m.npz"], 2, r"huge\.npy: .*declares shape \(100000000000, 8\)")
    run_checked(tmp_path, ["fit", "negative.npy", "-o", "m.npz"], 2, r"negative\.npy: .*negative dimensions")
    run_checked(tmp_path, ["fit", "empty.npy", "-o", "m.npz"], 2, r"empty\.npy: cannot read as \.npy")
    pairs = ["eval", "--pairs-a", "g.h5", "--pairs-b", "g.h5", "--scores"]
    run_checked(tmp_path, [*pairs, "scores.npy"], 2, r"scores\.npy: .*declares shape \(100000000000,\)")
    run_checked(tmp_path, [*pairs, "empty.npy"], 2, r"empty\.npy: cannot read as \.npy")
    from streamwhiten import serving
    from streamwhiten.errors import ModelFileError

    with pytest.raises(ModelFileError, match="declares shape"):
        serving.load(tmp_path / "model.npz")


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_a_npy_file_of_every_format_version_numpy_writes_is_read(tmp_path, version):
    """numpy writes (and reads) .npy format 1.0, 2.0 and 3.0 (a UTF-8 header); each is read, locally and
    its header by our own reader, as numpy itself reads it (issue #36: 3.0 was an internal error)."""
    from numpy.lib import format as npy_format

    from streamwhiten._npz import npy_header
    from streamwhiten.io import open_source

    path = tmp_path / "x.npy"
    with open(path, "wb") as handle:
        npy_format.write_array(handle, SMALL, version=version)
    with open(path, "rb") as handle:
        shape, dtype, fortran, offset = npy_header(handle, os.path.getsize(path))
    assert (shape, dtype, fortran) == (SMALL.shape, SMALL.dtype, False)
    assert offset == os.path.getsize(path) - SMALL.nbytes
    with open_source(str(path)) as source:
        np.testing.assert_array_equal(source.read(0, source.n_rows), np.load(path))


def test_a_npy_file_of_a_format_version_numpy_does_not_read_is_bad_input(tmp_path):
    from numpy.lib import format as npy_format

    with open(tmp_path / "x.npy", "wb") as handle:
        npy_format.write_array(handle, SMALL, version=(3, 0))
    raw = bytearray((tmp_path / "x.npy").read_bytes())
    raw[6] = 4  # format 4.0: no numpy reads it
    (tmp_path / "x.npy").write_bytes(bytes(raw))
    run_checked(tmp_path, ["fit", "x.npy", "-o", "m.npz"], 2, r"x\.npy: cannot read as \.npy .*version 4\.0")


def _hdf5_with_groups(path):
    rng = np.random.default_rng(5)
    with h5py.File(path, "w") as handle:
        handle.create_group("a/b").create_dataset(
            "emb", data=rng.standard_normal((200, 8)).astype("f4"), chunks=(50, 8)
        )
        handle.create_dataset("other", data=np.arange(10.0))


def test_hdf5_files_with_damaged_metadata_are_refused_as_damaged_never_an_internal_error(tmp_path, small_model):
    """Every byte of an HDF5 file's first 4 KiB (superblock, object headers, B-trees, heaps) flipped in
    turn: opening and reading the store either works or raises one of our errors, never HDF5's own
    ``RuntimeError: Object visitation failed`` (issue #36); the damaged metadata is named as such."""
    from streamwhiten.errors import CorruptStoreError, StreamwhitenError
    from streamwhiten.io import open_source

    _hdf5_with_groups(tmp_path / "base.h5")
    raw = (tmp_path / "base.h5").read_bytes()
    damaged_metadata = None
    for position in range(0, min(len(raw), 4096), 7):
        flipped = bytearray(raw)
        flipped[position] ^= 0xFF
        (tmp_path / "bad.h5").write_bytes(bytes(flipped))
        for spec in ("bad.h5", "bad.h5:/a/b/emb"):
            try:
                with open_source(str(tmp_path / spec)) as source:
                    source.read(0, source.n_rows)
            except StreamwhitenError as exc:
                if isinstance(exc, CorruptStoreError) and "metadata is damaged" in str(exc):
                    damaged_metadata = position, spec
    assert damaged_metadata is not None, "no flipped byte was reported as damaged metadata"
    flipped = bytearray(raw)
    position, spec = damaged_metadata
    flipped[position] ^= 0xFF
    (tmp_path / "bad.h5").write_bytes(bytes(flipped))
    (tmp_path / "m.npz").write_bytes(small_model)
    for args in (["fit", spec, "-o", "m2.npz"], ["apply", "m.npz", spec, "-o", "o.zarr"]):
        result = run_command(*args, cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert "bad.h5" in result.stderr and "internal error" not in result.stderr


def test_an_hdf5_error_with_a_system_errno_is_an_io_error_not_damaged_metadata():
    """HDF5's walk of a file fails for two kinds of reasons: a system call that failed (too many open files,
    out of memory, a failing disk: errno set, exit 74) and metadata that does not decode (no errno: exit 2)."""
    import errno

    from streamwhiten.errors import CorruptStoreError, StoreIOError
    from streamwhiten.io.hdf5 import _walking

    def raised(exc):
        with pytest.raises((StoreIOError, CorruptStoreError)) as found, _walking("f.h5"):
            raise exc
        return found.value

    for code in (errno.EMFILE, errno.ENOMEM, errno.EIO, errno.EACCES):
        assert isinstance(raised(OSError(code, os.strerror(code))), StoreIOError)
    assert isinstance(raised(OSError("Can't read data (errno = 5, error message = 'x')")), StoreIOError)
    for damaged in (RuntimeError("Object visitation failed"), OSError("bad object header version number")):
        assert type(raised(damaged)) is CorruptStoreError
