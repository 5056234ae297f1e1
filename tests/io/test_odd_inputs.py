"""Inputs that are not what they claim to be (issues #23, #36).

Each case sets up the user's files in a directory of its own and names one command that must fail
(or, for hard links, give the right numbers): the exit code, exactly one line on stderr saying what is
wrong, and every file of the user's byte for byte as it was (FIFOs, devices and sockets are never
opened: a FIFO would block the test as it blocked the command). Hard links and symbolic links, FIFOs,
devices and sockets, unreadable files, a job file that is not UTF-8, demo options that cannot work,
wrong names inside a store, qrels ids and id columns that are not what they say.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import h5py
import numpy as np
import pytest
import zarr
from conftest import run_command, write_h5, write_zarr
from user_files import SMALL, run_checked

#: How a command runs as a user who may not read a file mode 000: as such a user, or as root without
#: the capabilities that bypass file permissions.
SETPRIV = shutil.which("setpriv")


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
    assert run_command("fit", tmp_path / "g.h5", "-o", tmp_path / "m.npz", "-q").returncode == 0
    recorded = load_model(str(tmp_path / "m.npz")).sources
    assert [s.path for s in recorded] == [os.path.realpath(tmp_path / "g.h5")]  # the record is unchanged
    run_checked(tmp_path, ["fit", "l.h5", "--update", "m.npz"], 3, r"nothing to do")
    with h5py.File(tmp_path / "g.h5", "a") as handle:
        handle["emb"].resize(len(SMALL), axis=0)
        handle["emb"][300:] = more
    done = run_command("fit", tmp_path / "l.h5", "--update", tmp_path / "m.npz", "-q", "--json")
    assert done.returncode == 0, done.stderr
    model = load_model(str(tmp_path / "m.npz"))
    assert model.n_rows == len(SMALL)  # 400: not 300 + 400 read again through the other name
    assert json_of(done.stdout)["rows_read"] == len(more)
    np.testing.assert_allclose(model.mean, SMALL.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.state.scatter / len(SMALL), np.cov(SMALL.T, bias=True), rtol=1e-5, atol=1e-6)


def json_of(text: str) -> dict:

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
