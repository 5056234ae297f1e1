"""Damaged input stores (issue #14, "nothing lost, nothing silently wrong").

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
on ``fit``/``apply``, ``Whitener(fill_missing_chunks=True)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest
import zarr
from conftest import REPO, anisotropic, run_subprocess, write_h5, write_zarr

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
        result = run_subprocess("fit", spec, "-o", tmp_path / "model.npz", "-q")
    else:
        result = run_subprocess("apply", model_path, spec, "-o", f"{tmp_path / 'out.h5'}:/y", "-q")
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
    fitted = run_subprocess("fit", spec, "-o", tmp_path / "m.npz", "-q", "--fill-missing-chunks")
    assert fitted.returncode == 0 and not fitted.stderr, fitted.stderr
    assert run_subprocess("fit", reference, "-o", tmp_path / "ref.npz", "-q").returncode == 0
    model, expected = load_model(str(tmp_path / "m.npz")), load_model(str(tmp_path / "ref.npz"))
    assert model.n_rows == expected.n_rows == ROWS
    np.testing.assert_allclose(model.state.mean, expected.state.mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.state.scatter, expected.state.scatter, rtol=1e-10, atol=1e-9)

    applied = run_subprocess(
        "apply", model_path, spec, "-o", f"{tmp_path / 'out.h5'}:/y", "-q", "--fill-missing-chunks"
    )
    assert applied.returncode == 0 and not applied.stderr, applied.stderr
    assert run_subprocess("apply", model_path, reference, "-o", f"{tmp_path / 'ref.h5'}:/y", "-q").returncode == 0
    with h5py.File(tmp_path / "out.h5", "r") as out, h5py.File(tmp_path / "ref.h5", "r") as ref:
        np.testing.assert_allclose(out["y"][...], ref["y"][...], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("holed", ["zarr3", "zarr3-zstd"], indirect=True)
def test_fill_missing_chunks_api(holed):
    from streamwhiten import Whitener

    spec, _, filled = holed
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fitted = Whitener(fill_missing_chunks=True).fit(spec)
    expected = Whitener().fit(filled)
    assert fitted.n_samples_seen_ == ROWS
    np.testing.assert_allclose(fitted.mean_, expected.mean_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fitted.covariance_, expected.covariance_, rtol=1e-6, atol=1e-9)


def test_fill_missing_chunks_does_not_hide_other_damage(tmp_path, rows):
    spec, _ = damaged_store(tmp_path, "zarr3-zstd", "garbage-chunk", rows)
    result = run_subprocess("fit", spec, "-o", tmp_path / "m.npz", "-q", "--fill-missing-chunks")
    problems, line = one_error_line(result)
    problems += names_the_damage(line, "zarr3-zstd", "garbage-chunk")
    assert not problems and not (tmp_path / "m.npz").exists(), "; ".join(problems) + f"\n{result.stderr!r}"


# ----------------------------------------------- inputs that are not what they claim to be (issue #23)
#
# Each case sets up the user's files in a directory of its own and names one command that must fail
# (or, for hard links, give the right numbers): the exit code, exactly one line on stderr saying what is
# wrong, and every file of the user's byte for byte as it was (FIFOs, devices and sockets are never
# opened: a FIFO would block the test as it blocked the command).

SMALL = anisotropic(400, 8, seed=23).astype(np.float32)
#: How a command runs as a user who may not read a file mode 000: as such a user, or as root without
#: the capabilities that bypass file permissions.
SETPRIV = shutil.which("setpriv")


def snapshot(directory) -> dict:
    """``{relative path: (kind, size, sha256 or None)}`` of everything under ``directory``, without opening
    anything but regular files (and those only when readable)."""
    import hashlib
    import stat

    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            status = os.lstat(path)
            digest = None
            if stat.S_ISREG(status.st_mode) and os.access(path, os.R_OK):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            found[os.path.relpath(path, directory)] = (
                stat.S_IFMT(status.st_mode),
                status.st_size if stat.S_ISREG(status.st_mode) else 0,
                stat.S_IMODE(status.st_mode),
                digest,
            )
    return found


def unreadable(path) -> None:
    """Make ``path`` unreadable to the commands of the permission cases (see :func:`as_reader`)."""
    os.chmod(path, 0)


def as_reader() -> list:
    """The prefix that runs a command as a user bound by file permissions (root is not: then without
    the capabilities that let root read any file)."""
    if os.geteuid() != 0:
        return []
    if SETPRIV is None:
        pytest.skip("running as root without setpriv: a file of mode 000 cannot be made unreadable")
    return [SETPRIV, "--bounding-set=-dac_override,-dac_read_search"]


def run_checked(tmp_path, args, code, pattern, prefix=(), outputs=()):
    """Run ``streamwhiten ARGS`` in ``tmp_path``; assert exit ``code``, one stderr line matching
    ``pattern``, and every file as it was (``outputs``: names the command may add)."""

    def mine(found):
        return {name: entry for name, entry in found.items() if name.split(os.sep)[0] not in outputs}

    before = mine(snapshot(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "streamwhiten", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    lines = result.stderr.splitlines()
    problems = []
    if result.returncode != code:
        problems.append(f"exit code {result.returncode}, expected {code}")
    if len(lines) != 1 or not lines[0].startswith("streamwhiten:"):
        problems.append(f"stderr should be one line 'streamwhiten: ...', got {lines!r}")
    elif not re.search(pattern, lines[0]):
        problems.append(f"the line does not match {pattern!r}")
    after = mine(snapshot(tmp_path))
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        problems.append(f"the user's files changed: {changed[:6]}")
    assert not problems, f"streamwhiten {' '.join(map(str, args))}: " + "; ".join(problems) + f"\n{result.stderr!r}"
    return result


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from streamwhiten import Whitener

    path = tmp_path_factory.mktemp("small-model") / "model.npz"
    Whitener(n_components=4).fit(SMALL).save(str(path))
    return path.read_bytes()


def test_a_hard_link_given_beside_its_file_is_refused_not_counted_twice(tmp_path):
    write_h5(tmp_path / "g.h5", SMALL)
    os.link(tmp_path / "g.h5", tmp_path / "l.h5")
    os.symlink(tmp_path / "g.h5", tmp_path / "s.h5")
    run_checked(tmp_path, ["fit", "g.h5:/emb", "l.h5:/emb", "-o", "m.npz"], 2, r"l\.h5:/emb: given twice .*g\.h5")
    run_checked(tmp_path, ["fit", "g.h5:/emb", "s.h5:/emb", "-o", "m.npz"], 2, r"s\.h5:/emb: given twice .*g\.h5")
    os.link(tmp_path / "g.h5", tmp_path / "sub.h5")  # the same file under a name of another form
    write_zarr(tmp_path / "z.zarr", SMALL)
    os.symlink(tmp_path / "z.zarr", tmp_path / "y.zarr")  # a directory too is one store however it is named
    run_checked(tmp_path, ["fit", "z.zarr", "y.zarr", "-o", "m.npz"], 2, r"y\.zarr: given twice")


def test_update_recognises_a_recorded_file_by_its_identity_not_its_path(tmp_path):
    """An update through a hard link of the recorded file reads only the rows appended since (the model's
    record, a path, is compared by device and inode when it is used), and a model whose file is given
    under another name is still up to date."""
    from streamwhiten.core.model import load_model

    first, more = SMALL[:300], SMALL[300:]
    with h5py.File(tmp_path / "g.h5", "w") as handle:
        handle.create_dataset("emb", data=first, maxshape=(None, SMALL.shape[1]), chunks=(64, SMALL.shape[1]))
    os.link(tmp_path / "g.h5", tmp_path / "l.h5")
    assert run_subprocess("fit", tmp_path / "g.h5", "-o", tmp_path / "m.npz", "-q").returncode == 0
    recorded = load_model(str(tmp_path / "m.npz")).sources
    assert [s.path for s in recorded] == [os.path.realpath(tmp_path / "g.h5")]  # the record is unchanged
    run_checked(tmp_path, ["fit", "l.h5", "--update", "m.npz"], 3, r"nothing to do")
    with h5py.File(tmp_path / "g.h5", "a") as handle:
        handle["emb"].resize(len(SMALL), axis=0)
        handle["emb"][300:] = more
    done = run_subprocess("fit", tmp_path / "l.h5", "--update", tmp_path / "m.npz", "-q", "--json")
    assert done.returncode == 0, done.stderr
    model = load_model(str(tmp_path / "m.npz"))
    assert model.n_rows == len(SMALL)  # 400: not 300 + 400 read again through the other name
    assert json_of(done.stdout)["rows_read"] == len(more)
    np.testing.assert_allclose(model.mean, SMALL.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.state.scatter / len(SMALL), np.cov(SMALL.T, bias=True), rtol=1e-5, atol=1e-6)


def json_of(text: str) -> dict:
    import json

    return json.loads(text)


@pytest.mark.parametrize("what", ["fifo", "character-device", "socket"])
def test_an_input_that_is_not_a_file_or_directory_is_refused_at_once(tmp_path, small_model, what):
    (tmp_path / "model.npz").write_bytes(small_model)
    if what == "fifo":
        os.mkfifo(tmp_path / "f.npy")
        name, kind = "f.npy", "a FIFO"
    elif what == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(tmp_path / "s.h5"))
        name, kind = "s.h5", "a socket"
    else:
        os.symlink("/dev/zero", tmp_path / "z.npy")  # reading it would never end
        name, kind = "z.npy", "a character device"
    pattern = rf"{re.escape(name)}: is {kind}.*not a regular file or directory"
    run_checked(tmp_path, ["fit", name, "-o", "m.npz"], 2, pattern)
    run_checked(tmp_path, ["apply", "model.npz", name, "-o", "out.zarr"], 2, pattern)
    run_checked(tmp_path, ["fit", f"{name}:/emb", "-o", "m.npz"], 2, pattern)


def test_model_job_and_score_files_that_are_fifos_are_refused_at_once(tmp_path, small_model):
    write_h5(tmp_path / "g.h5", SMALL)
    os.mkfifo(tmp_path / "model.npz")
    os.mkfifo(tmp_path / "job.toml")
    os.mkfifo(tmp_path / "scores.npy")
    fifo = r"is a FIFO \(named pipe\), not a regular file"
    run_checked(tmp_path, ["info", "model.npz"], 2, rf"model\.npz: model file {fifo}")
    run_checked(tmp_path, ["apply", "model.npz", "g.h5", "-o", "o.zarr"], 2, rf"model\.npz: model file {fifo}")
    run_checked(tmp_path, ["export", "model.npz", "-o", "map.npz"], 2, rf"model\.npz: model file {fifo}")
    run_checked(tmp_path, ["fit", "g.h5", "--update", "model.npz"], 2, rf"model\.npz: model file {fifo}")
    run_checked(tmp_path, ["run", "job.toml"], 2, rf"job\.toml: job file {fifo}")
    run_checked(
        tmp_path,
        ["eval", "--pairs-a", "g.h5", "--pairs-b", "g.h5", "--scores", "scores.npy"],
        2,
        rf"scores\.npy: {fifo}",
    )
    from streamwhiten import serving
    from streamwhiten.errors import ModelFileError

    with pytest.raises(ModelFileError, match=fifo):
        serving.load(tmp_path / "model.npz")


def test_permission_denied_on_an_input_is_an_io_error(tmp_path, small_model):
    prefix = as_reader()
    (tmp_path / "model.npz").write_bytes(small_model)
    write_h5(tmp_path / "g.h5", SMALL)
    np.save(tmp_path / "f.npy", SMALL)
    write_zarr(tmp_path / "z.zarr", SMALL)
    (tmp_path / "job.toml").write_text('[input]\npaths = ["f.npy"]\n[model]\npath = "job-model.npz"\n')
    for name in ("g.h5", "f.npy", "z.zarr/c/1/0", "job.toml"):
        unreadable(tmp_path / name)
    denied = r"(permission denied|Permission denied)"
    run_checked(tmp_path, ["fit", "g.h5", "-o", "m.npz"], 74, rf"g\.h5: .*{denied}", prefix)
    run_checked(tmp_path, ["fit", "f.npy", "-o", "m.npz"], 74, rf"f\.npy: .*{denied}", prefix)
    run_checked(tmp_path, ["fit", "z.zarr", "-o", "m.npz"], 74, rf"z\.zarr: .*rows 100\.\.199.*{denied}", prefix)
    run_checked(tmp_path, ["apply", "model.npz", "g.h5", "-o", "o.zarr"], 74, rf"g\.h5: .*{denied}", prefix)
    run_checked(tmp_path, ["run", "job.toml"], 74, rf"job\.toml: .*{denied}", prefix)
    unreadable(tmp_path / "model.npz")
    run_checked(tmp_path, ["info", "model.npz"], 74, rf"model\.npz: .*{denied}", prefix)


def test_a_zarr_chunk_replaced_by_a_directory_is_damaged_data(tmp_path):
    write_zarr(tmp_path / "z.zarr", SMALL)
    os.remove(tmp_path / "z.zarr" / "c" / "2" / "0")
    os.mkdir(tmp_path / "z.zarr" / "c" / "2" / "0")
    pattern = r"z\.zarr: chunk c/2/0 \(rows 200\.\.299\) is a directory, not a chunk file"
    run_checked(tmp_path, ["fit", "z.zarr", "-o", "m.npz"], 2, pattern)


def _edit_json(path, edit) -> None:
    import json

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


def test_a_job_file_that_is_not_utf8_is_bad_input(tmp_path):
    (tmp_path / "job.toml").write_bytes(b'name = "\xff\xfe"\n[input]\npaths = ["x.h5"]\n')
    run_checked(
        tmp_path, ["run", "job.toml"], 2, r"job\.toml: not a valid TOML job file \(TOML is UTF-8 text; byte 0xff"
    )


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--rows", "0"], r"'--rows'"),
        (["--rows", "-5"], r"'--rows'"),
        (["--dim", "0"], r"'--dim'"),
        (["--chunk-rows", "0"], r"'--chunk-rows'"),
        (["-k", "0"], r"n_components"),
        (["--dim", "4", "-k", "8"], r"n_components \(k\) = 8 exceeds the data width d = 4"),
        (["--dir", "a-file"], r"'--dir': a-file is a file, not a directory"),
    ],
)
def test_demo_options_that_cannot_work_are_usage_errors(tmp_path, args, pattern):
    (tmp_path / "a-file").write_text("mine\n")
    run_checked(tmp_path, ["demo", "-q", *args], 2, pattern)


def _name_stores(tmp_path) -> None:
    """One store of each kind holding one 2-D array ``emb`` (and a 1-D ``gold`` where a store can hold two)."""
    import lance
    import pyarrow as pa
    import pyarrow.parquet as pq

    with h5py.File(tmp_path / "s.h5", "w") as handle:
        handle["emb"] = SMALL
        handle["gold"] = np.arange(len(SMALL), dtype=np.float64)
    for version in (2, 3):
        group = zarr.open_group(str(tmp_path / f"v{version}.zarr"), mode="w", zarr_format=version)
        group.create_array("emb", data=SMALL, chunks=(100, SMALL.shape[1]))
        group.create_array("gold", data=np.arange(len(SMALL), dtype=np.float64))
    np.save(tmp_path / "s.npy", SMALL)
    table = pa.table(
        {
            "id": np.arange(len(SMALL)),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(SMALL.reshape(-1)), SMALL.shape[1]),
        }
    )
    pq.write_table(table, tmp_path / "s.parquet")
    lance.write_dataset(table, str(tmp_path / "s.lance"))
    (tmp_path / "s.csv").write_text("0.5\n")


#: spec -> what the one line must say: the name asked for, what the store holds, and how to name it.
WRONG_NAMES = {
    "s.h5:/embeddings": r"s\.h5: has no 2-D dataset /embeddings; its 2-D datasets: /emb \(name it as s\.h5:/emb",
    "s.h5/emb": r"s\.h5/emb: no such file or directory; s\.h5 is a file: to name 'emb' inside it, write s\.h5:/emb",
    "v2.zarr:/embeddings": r"v2\.zarr: has no 2-D array /embeddings; its 2-D arrays: /emb \(name it as v2\.zarr:/emb",
    "v3.zarr:/embeddings": r"v3\.zarr: has no 2-D array /embeddings; its 2-D arrays: /emb \(name it as v3\.zarr:/emb",
    "v3.zarr/embeddings": r"v3\.zarr: has no 2-D array /embeddings; its 2-D arrays: /emb \(name it as v3\.zarr:/emb",
    "s.npy:/emb": r"s\.npy: has no array /emb: a \.npy file holds one array, with no name inside \(name it as s\.npy\)",
    "s.parquet:embedding": r"s\.parquet: has no vector column 'embedding'; its vector columns: emb; other columns: "
    r"id \(int64\) \(name it as s\.parquet:emb",
    "s.lance:embedding": r"s\.lance: has no vector column 'embedding'; its vector columns: emb; other columns: "
    r"id \(int64\) \(name it as s\.lance:emb",
    "s.csv": r"^streamwhiten: error: s\.csv: not an HDF5, Parquet or \.npy file, nor a Zarr store or Lance dataset$",
}


def test_a_wrong_name_inside_a_store_says_what_was_asked_what_exists_and_how_to_name_it(tmp_path):
    _name_stores(tmp_path)
    for spec, pattern in WRONG_NAMES.items():
        run_checked(tmp_path, ["fit", spec, "-o", "m.npz"], 2, pattern)
    # 1-D vectors (gold scores) are named the same way
    pairs = ["eval", "--pairs-a", "s.h5:/emb", "--pairs-b", "s.h5:/emb", "--scores"]
    run_checked(tmp_path, [*pairs, "s.h5:/score"], 2, r"s\.h5: has no 1-D dataset /score; its 1-D datasets: /gold")
    run_checked(tmp_path, [*pairs, "v3.zarr:/score"], 2, r"v3\.zarr: has no 1-D array /score; its 1-D arrays: /gold")
    run_checked(tmp_path, [*pairs, "s.parquet:score"], 2, r"s\.parquet: has no numeric column 'score'; .*: id")
    run_checked(
        tmp_path,
        [*pairs, "s.csv"],
        2,
        r"^streamwhiten: error: s\.csv: no column named; its first line has 1 field\(s\): '0\.5': write "
        r"s\.csv:NAME for a header field, or s\.csv:INDEX for a 0-based column",
    )


# ------------------------------------------- model files, checkpoints and maps edited by hand (issue #23)


def rewrite_npz(source, target, **changes) -> None:
    """``source`` with the arrays in ``changes`` replaced (a callable gets the old array), and its checksum
    recomputed as anyone can: a file whose checksum holds, but that no fit wrote."""
    from streamwhiten._npz import checksum

    with np.load(source, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != "checksum"}
    for key, change in changes.items():
        arrays[key] = np.asarray(change(arrays[key]) if callable(change) else change)
    with open(target, "wb") as handle:  # a file object: np.savez would add ".npz" to a checkpoint's name
        np.savez(handle, **arrays, checksum=np.array(checksum(arrays)))


def _rotated(eigvecs):
    """Columns of unit length that are no longer orthogonal (the first two mixed)."""
    edited = eigvecs.copy()
    edited[:, 1] = (eigvecs[:, 0] + eigvecs[:, 1]) / np.sqrt(2)
    edited[:, 1] /= np.linalg.norm(edited[:, 1])
    return edited


def _asymmetric(scatter):
    edited = scatter.copy()
    edited[0, 1] += 0.5 * abs(scatter[0, 0])
    return edited


#: field -> (edit, what the one line says)
MODEL_EDITS = {
    "eigvals-nan": ({"eigvals": lambda v: np.where(np.arange(v.size) == 3, np.nan, v)}, r"'eigvals' holds NaN or Inf"),
    "gamma-7": ({"gamma": 7.0}, r"'gamma' must be a number in \[0, 1\], got 7\.0"),
    "beta-negative": ({"beta": -0.5}, r"'beta' must be a number in \[0, 1\]"),
    "eps-zero": ({"eps": 0.0}, r"'eps' must be a positive finite number"),
    "variance-2": ({"variance": 2.0}, r"'variance' must be a fraction in \(0, 1\]"),
    "k-0": ({"n_components": np.int64(0)}, r"'n_components' must be at least 1"),
    "k-above-d": ({"n_components": np.int64(9)}, r"'n_components' is 9, more than the model's 8 features"),
    "k-float": ({"n_components": 4.0}, r"'n_components' must be a whole number"),
    "n-rows-1": ({"n_rows": np.int64(1)}, r"'n_rows' must be at least 2"),
    "mean-shape": ({"mean": lambda v: v[:-1]}, r"'mean' has shape \(7,\)"),
    "mean-inf": ({"mean": lambda v: np.where(np.arange(v.size) == 0, np.inf, v)}, r"'mean' holds NaN or Inf"),
    "scatter-asymmetric": ({"scatter": _asymmetric}, r"'scatter' is not symmetric"),
    "scatter-negative": ({"scatter": lambda v: v - 2 * np.diag(np.diag(v))}, r"'scatter' has a negative diagonal"),
    "eigvals-ascending": ({"eigvals": lambda v: v[::-1].copy()}, r"'eigvals' is not in descending order"),
    "eigvals-negative": ({"eigvals": lambda v: v - v[1]}, r"'eigvals' holds a negative eigenvalue"),
    "eigvals-scaled": (
        {"eigvals": lambda v: 2 * v, "eps_value": lambda v: 2 * v},
        r"'eigvals' and eigvecs are not the eigendecomposition",
    ),
    "eigvecs-long": ({"eigvecs": lambda v: 2 * v}, r"'eigvecs' has a column that is not of unit length"),
    "eigvecs-skewed": ({"eigvecs": _rotated}, r"'eigvecs' is not orthonormal"),
    "eps-value": ({"eps_value": lambda v: 10 * v}, r"'eps_value' is .*, but eps \* the largest eigenvalue is"),
    "k-not-variance": ({"variance": 0.5, "n_components": np.int64(8)}, r"'n_components' is 8, but the variance 0\.5"),
    "sources-type": ({"sources_json": np.array('{"path": 1}')}, r"'sources_json' must be a JSON list"),
    "source-rows": (
        {"sources_json": np.array('[{"path": "x.h5", "n_rows": "many"}]')},
        r"'sources_json' source 0: n_rows must be a whole",
    ),
    "info-precision": ({"info_json": np.array('{"precision": "float128"}')}, r"'info_json' precision must be one of"),
    "format-missing": ({"n_features": np.array("8")}, r"'n_features' must be a whole number"),
}


@pytest.mark.parametrize("case", MODEL_EDITS)
def test_a_model_file_that_no_fit_could_have_written_is_refused(tmp_path, small_model, case, run_cli):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model
    from streamwhiten.errors import ModelFileError

    edits, pattern = MODEL_EDITS[case]
    (tmp_path / "good.npz").write_bytes(small_model)
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", **edits)
    write_h5(tmp_path / "g.h5", SMALL)
    line = rf"^streamwhiten: error: {re.escape(str(tmp_path / 'model.npz'))}: model file field {pattern}"
    before = snapshot(tmp_path)
    for args in (
        ["info", tmp_path / "model.npz"],
        ["apply", tmp_path / "model.npz", tmp_path / "g.h5", "-o", tmp_path / "out.zarr"],
        ["export", tmp_path / "model.npz", "-o", tmp_path / "map.npz"],
    ):
        code, _, err = run_cli(*args)
        assert code == 2 and len(err.splitlines()) == 1 and re.search(line, err), (args, code, err)
    assert snapshot(tmp_path) == before
    for load in (load_model, serving.load):
        with pytest.raises(ModelFileError, match=pattern):
            load(str(tmp_path / "model.npz"))


def test_an_edited_model_is_refused_by_the_command_line_in_one_line(tmp_path, small_model):
    (tmp_path / "good.npz").write_bytes(small_model)
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", gamma=7.0)
    write_h5(tmp_path / "g.h5", SMALL)
    run_checked(tmp_path, ["apply", "model.npz", "g.h5", "-o", "o.zarr"], 2, r"model\.npz: model file field 'gamma'")
    run_checked(tmp_path, ["fit", "g.h5", "--update", "model.npz"], 2, r"model\.npz: model file field 'gamma'")


def test_the_models_the_package_writes_all_pass_the_checks(tmp_path, small_model):
    """The checks hold for what fits write: every setting of the same statistics, a constant column, a
    rank-deficient store, float64 rows, and the models of ``tune``'s grid."""
    from streamwhiten import Whitener
    from streamwhiten.core.model import load_model

    rank_deficient = np.hstack([SMALL[:, :4], SMALL[:, :4] * 2.0, np.full((len(SMALL), 2), 7.0)])
    for rows in (SMALL, rank_deficient, SMALL.astype(np.float64) * 1e6, SMALL[:2]):
        for params in ({}, {"beta": 0.0, "gamma": 0.0}, {"variance": 0.9}, {"n_components": 1, "eps": 1e-3}):
            Whitener(**params).fit(rows).save(str(tmp_path / "m.npz"))
            load_model(str(tmp_path / "m.npz"))


def _storage(edit):
    """An edit of the ``storage_json`` of a model recording int8 storage: ``edit(record)`` changes the dict."""

    def change(value):
        record = json.loads(str(value))
        edit(record)
        return np.array(json.dumps(record))

    return {"storage_json": change}


def _scaled_int8(record):
    record["quantization"]["scale"][0] *= 1.01


#: storage edits of a model that records int8 storage (what ``tune --queries ...`` writes) -> the one line
STORAGE_EDITS = {
    "not-json": ({"storage_json": np.array("{int8")}, r"'storage_json' is not valid JSON"),
    "dtype": (_storage(lambda r: r.update(dtype="int4")), r"'storage_json' is no storage: dtype must be"),
    "rescore-float": (
        _storage(lambda r: r.update(rescore=10)),
        r"'storage_json' is no storage: rescore re-ranks a bit search",
    ),
    "clip": (_storage(lambda r: r.update(int8_clip=0.0)), r"'storage_json' is no storage: int8_clip must be a number"),
    "bytes": (_storage(lambda r: r.update(bytes_per_vector=3)), r"'storage_json' says 3 bytes per vector, but int8"),
    "ranges": (_storage(_scaled_int8), r"'storage_json' quantization is not the int8 record the saved statistics"),
    "no-record": (
        _storage(lambda r: r.update(quantization=None)),
        r"'storage_json' quantization: not a streamwhiten-quantization",
    ),
    "stray-record": (
        _storage(lambda r: r.update(rescore_quantization=r["quantization"])),
        r"'storage_json' holds a rescore_quantization record its storage has no use for",
    ),
}


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    from streamwhiten import Whitener

    path = tmp_path_factory.mktemp("int8-model") / "model.npz"
    Whitener(n_components=4, dtype="int8").fit(SMALL).save(str(path))
    return path.read_bytes()


@pytest.mark.parametrize("case", STORAGE_EDITS)
def test_a_storage_that_no_tune_could_have_written_is_refused(tmp_path, int8_model, case, run_cli):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model
    from streamwhiten.errors import ModelFileError

    (tmp_path / "good.npz").write_bytes(int8_model)
    assert load_model(str(tmp_path / "good.npz")).storage.dtype == "int8"  # what is written passes
    edits, pattern = STORAGE_EDITS[case]
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", **edits)
    code, _, err = run_cli("info", tmp_path / "model.npz")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(rf"model\.npz: model file field {pattern}", err), err
    for load in (load_model, serving.load):
        with pytest.raises(ModelFileError, match=pattern):
            load(str(tmp_path / "model.npz"))


def test_a_model_file_without_a_storage_is_float32_and_reads_as_before(tmp_path, small_model):
    from streamwhiten import serving
    from streamwhiten.core.model import file_checksum, load_model

    (tmp_path / "model.npz").write_bytes(small_model)
    with np.load(tmp_path / "model.npz") as arrays:
        assert "storage_json" not in arrays.files  # a model that records none is written as before
    model = load_model(str(tmp_path / "model.npz"))
    assert (model.storage, model.dtype, serving.load(tmp_path / "model.npz").quantization) == (None, "float32", None)
    with np.load(tmp_path / "model.npz") as arrays:
        assert str(arrays["checksum"]) == file_checksum(model)


CHECKPOINT_EDITS = {
    "n-rows": ({"n_rows": lambda v: v + 5}, r"checkpoint field 'n_rows' is \d+, but the rows recorded as read"),
    "scatter-nan": ({"scatter": lambda v: v * np.nan}, r"checkpoint field 'scatter' holds NaN or Inf"),
    "cursor": (
        {"meta_json": lambda v: np.array(str(v).replace('"next_row": ', '"next_row": -'))},
        r"checkpoint field 'meta_json' cursor 0: start <= next_row <= stop",
    ),
    "precision": (
        {"meta_json": lambda v: np.array(str(v).replace('"auto"', '"float128"'))},
        r"checkpoint field 'meta_json' precision must be one of",
    ),
}


@pytest.mark.parametrize("case", CHECKPOINT_EDITS)
def test_a_checkpoint_that_no_fit_could_have_written_is_refused(tmp_path, case):
    from streamwhiten.engine.fit import plan_fit, run_plan, save_checkpoint

    write_h5(tmp_path / "g.h5", SMALL, chunk_rows=100)
    job = plan_fit(str(tmp_path / "g.h5"), block_rows=100)
    run_plan(job)
    job.cursors[0].next_row = 200  # as if stopped after two blocks (the state is of all rows: not checked here)
    save_checkpoint(job, str(tmp_path / "good.checkpoint"))
    edits, pattern = CHECKPOINT_EDITS[case]
    if case != "n-rows":
        edits = dict(edits, n_rows=np.int64(200))
    rewrite_npz(tmp_path / "good.checkpoint", tmp_path / ".m.npz.checkpoint", **edits)
    os.remove(tmp_path / "good.checkpoint")
    run_checked(
        tmp_path,
        ["fit", "g.h5", "-o", "m.npz", "--chunk-rows", "100"],
        2,
        rf"\.m\.npz\.checkpoint: {pattern}.*--restart",
    )


MAP_EDITS = {
    "A-nan": ({"A": lambda v: v * np.nan}, r"'A' holds NaN or Inf"),
    "gamma-7": ({"gamma": 7.0}, r"'gamma' must be a number in \[0, 1\]"),
    "b": ({"b": lambda v: v + 1.0}, r"'b' is not -\(beta mean\) A"),
    "normalize": ({"normalize": np.array("yes")}, r"'normalize' must be true or false"),
}


@pytest.mark.parametrize("case", MAP_EDITS)
def test_an_exported_map_that_no_export_could_have_written_is_refused(tmp_path, small_model, case):
    from streamwhiten import serving
    from streamwhiten.errors import ModelFileError

    (tmp_path / "model.npz").write_bytes(small_model)
    assert run_subprocess("export", tmp_path / "model.npz", "-o", tmp_path / "good.npz").returncode == 0
    serving.load(tmp_path / "good.npz")  # what export writes passes
    edits, pattern = MAP_EDITS[case]
    rewrite_npz(tmp_path / "good.npz", tmp_path / "map.npz", **edits)
    with pytest.raises(ModelFileError, match=rf"map\.npz: whitening map field {pattern}"):
        serving.load(tmp_path / "map.npz")


# ------------------------------------------------------------- issue #36: every input fault exits 2, one line


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
        result = run_subprocess(*args, cwd=tmp_path)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert "bad.h5" in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("value", ["²", "①", "٣", "-1", "1.0"])
def test_qrels_ids_that_are_not_ascii_row_numbers_are_refused_by_line(tmp_path, value):
    """``"²".isdigit()`` is true and ``int("²")`` fails: a qrels id that is no plain row number is refused
    naming the file and line (issue #36: it was a ValueError), as any unknown id is."""
    from streamwhiten.errors import BadInputError
    from streamwhiten.evaluation.qrels import Ids, read_qrels

    (tmp_path / "q.tsv").write_text(f"query-id\tcorpus-id\tscore\n0\t1\t1\n{value}\t2\t1\n", encoding="utf-8")
    with pytest.raises(BadInputError, match=rf"q\.tsv: line 3: query-id '{re.escape(value)}' is not a row of"):
        read_qrels(str(tmp_path / "q.tsv"), Ids("q.h5", 10), Ids("c.h5", 10))
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\n0\t1\t1\n3\t2\t1\n", encoding="utf-8")
    assert read_qrels(str(tmp_path / "q.tsv"), Ids("q.h5", 10), Ids("c.h5", 10)).queries.tolist() == [0, 3]


@pytest.mark.parametrize("kind", ["parquet", "lance"])
def test_a_binary_id_column_that_is_not_utf8_is_refused_naming_the_row(tmp_path, kind):
    import pyarrow as pa

    from streamwhiten.errors import BadInputError
    from streamwhiten.io import open_source, read_ids

    ids = [f"doc{i}".encode() for i in range(len(SMALL))]
    ids[7] = b"\xff\xfe bad"
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(SMALL.reshape(-1)), SMALL.shape[1])
    table = pa.table({"id": pa.array(ids, pa.binary()), "emb": vectors})
    path = tmp_path / f"c.{kind}"
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    else:
        lance = pytest.importorskip("lance")
        lance.write_dataset(table, str(path))
    with open_source(f"{path}:emb") as source:
        with pytest.raises(BadInputError, match=r"row 7: the id in column 'id' is not valid UTF-8 text"):
            read_ids(source, "id")


def test_a_symbolic_link_loop_is_bad_input_not_an_io_error(tmp_path, small_model):
    """A path that is a symbolic link loop names no file (ELOOP): bad input, exit 2, as a missing file."""
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    write_h5(tmp_path / "g.h5", SMALL)
    (tmp_path / "m.npz").write_bytes(small_model)
    loop = r"loop-a: .*cannot be opened: Too many levels of symbolic links"
    run_checked(tmp_path, ["fit", "loop-a", "-o", "out.npz"], 2, loop)
    run_checked(tmp_path, ["apply", "m.npz", "loop-a", "-o", "o.zarr"], 2, loop)
    run_checked(
        tmp_path, ["apply", "loop-a", "g.h5", "-o", "o.zarr"], 2, r"loop-a: .*Too many levels of symbolic links"
    )


# ---------------------------------------------- issue #36: outputs carry checksums, verified when read

#: output name -> the apply options that write it
CHECKSUMMED_OUTPUTS = {
    "out.h5": [],
    "gzip.h5": ["--compressor", "gzip"],
    "out.zarr": [],
    "zstd.zarr": ["--compressor", "zstd"],
    "out.parquet": [],
}


def _flip(path, offset, mask=0x10):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ mask]))


def _data_byte(path):
    """A byte inside the stored data of the output's third chunk (HDF5, Zarr) or first data page (Parquet)."""
    if path.suffix == ".h5":
        with h5py.File(path, "r") as handle:
            return path, handle["embeddings"].id.get_chunk_info(2).byte_offset + 37
    if path.suffix == ".zarr":
        return path / "c" / "2" / "0", 37
    import pyarrow.parquet as pq

    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    return path, column.data_page_offset + column.total_compressed_size // 2


@pytest.mark.parametrize("name", sorted(CHECKSUMMED_OUTPUTS))
def test_flipped_data_bytes_in_an_output_are_refused_when_read(tmp_path, small_model, name):
    """An output's chunks carry checksums (HDF5 fletcher32, Zarr 3 crc32c, Parquet page CRCs): one bit
    flipped inside its stored data is refused by every reader of ours, naming the file and rows -- never
    returned as values (issue #36: a published part with flipped bytes read back as 6e23)."""
    from streamwhiten.errors import CorruptStoreError
    from streamwhiten.io import open_source

    (tmp_path / "m.npz").write_bytes(small_model)
    write_h5(tmp_path / "in.h5", SMALL)
    args = ["apply", "m.npz", "in.h5", "-o", name, "--chunk-rows", "100", "-q", *CHECKSUMMED_OUTPUTS[name]]
    assert run_subprocess(*args, cwd=tmp_path).returncode == 0
    with open_source(str(tmp_path / name)) as source:
        written = source.read(0, source.n_rows).copy()
    file, offset = _data_byte(tmp_path / name)
    _flip(file, offset)
    with pytest.raises(CorruptStoreError, match=rf"{re.escape(name)}\b.*(checksum|CRC)"):
        with open_source(str(tmp_path / name)) as source:
            source.read(0, source.n_rows)
    run_checked(tmp_path, ["fit", name, "-o", "refit.npz"], 2, rf"{re.escape(name)}.*(checksum|CRC)")
    _flip(file, offset)  # flipped back: read as written
    with open_source(str(tmp_path / name)) as source:
        np.testing.assert_array_equal(source.read(0, source.n_rows), written)


def test_outputs_without_checksums_hold_the_same_rows_and_plain_readers_verify_them(tmp_path, small_model):
    """``--no-checksums`` writes the same rows without the filter or codec; with checksums, h5py and zarr
    themselves read the outputs (and verify them), as any reader of the format does."""
    (tmp_path / "m.npz").write_bytes(small_model)
    write_h5(tmp_path / "in.h5", SMALL)
    for name, extra in (("a.h5", []), ("b.h5", ["--no-checksums"]), ("a.zarr", []), ("b.zarr", ["--no-checksums"])):
        result = run_subprocess(
            "apply", "m.npz", "in.h5", "-o", name, "--chunk-rows", "100", "-q", *extra, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "a.h5") as one, h5py.File(tmp_path / "b.h5") as two:
        assert one["embeddings"].fletcher32 and not two["embeddings"].fletcher32
        np.testing.assert_array_equal(one["embeddings"][:], two["embeddings"][:])
        rows = one["embeddings"][:]
    checked, plain = zarr.open_array(tmp_path / "a.zarr", mode="r"), zarr.open_array(tmp_path / "b.zarr", mode="r")
    assert [type(codec).__name__ for codec in checked.metadata.codecs] == ["BytesCodec", "Crc32cCodec"]
    assert [type(codec).__name__ for codec in plain.metadata.codecs] == ["BytesCodec"]
    np.testing.assert_array_equal(checked[:], rows)
    np.testing.assert_array_equal(plain[:], rows)


@pytest.mark.parametrize("suffix", ["h5", "zarr"])
def test_a_published_part_with_flipped_data_bytes_is_refused_when_read(tmp_path, suffix):
    """Issue #36: bytes flipped inside a published part, its times restored, were read back by
    ``published().read`` as values (6e23); the part's checksums refuse it, naming the part."""
    from streamwhiten.errors import CorruptStoreError
    from streamwhiten.job import published, run_job_file

    write_h5(tmp_path / "day-1.h5", anisotropic(1200, 8, seed=9).astype(np.float32), chunk_rows=100)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["day-*.h5"]\n[model]\npath = "m.npz"\n'
        f'[apply]\noutput = "out-{{stem}}.{suffix}"\nchunk_rows = 100\n[publish]\n'
    )
    run_job_file(str(job))
    publication = published(str(tmp_path / "m.npz"))
    rows = publication.read(str(tmp_path / "day-1.h5"))
    part = tmp_path / publication.outputs[0]
    file, offset = _data_byte(part)
    times = os.stat(file)
    _flip(file, offset, mask=0x40)  # an exponent bit of a float32 value
    os.utime(file, ns=(times.st_atime_ns, times.st_mtime_ns))
    with pytest.raises(CorruptStoreError, match=rf"{re.escape(part.name)}.*rows 200\.\.299.*checksum mismatch"):
        published(str(tmp_path / "m.npz")).read(str(tmp_path / "day-1.h5"))
    _flip(file, offset, mask=0x40)
    np.testing.assert_array_equal(published(str(tmp_path / "m.npz")).read(str(tmp_path / "day-1.h5")), rows)


def test_an_hdf5_error_with_a_system_errno_is_an_io_error_not_damaged_metadata():
    """HDF5's walk of a file fails for two kinds of reasons: a system call that failed (too many open files,
    out of memory, a failing disk: errno set, exit 74) and metadata that does not decode (no errno: exit 2)."""
    import errno

    from streamwhiten.errors import CorruptStoreError, StoreIOError
    from streamwhiten.io.hdf5 import _metadata_error

    for code in (errno.EMFILE, errno.ENOMEM, errno.EIO, errno.EACCES):
        assert isinstance(_metadata_error("f.h5", OSError(code, os.strerror(code))), StoreIOError)
    assert isinstance(
        _metadata_error("f.h5", OSError("Can't read data (errno = 5, error message = 'x')")), StoreIOError
    )
    for damaged in (RuntimeError("Object visitation failed"), OSError("bad object header version number")):
        assert isinstance(_metadata_error("f.h5", damaged), CorruptStoreError)
