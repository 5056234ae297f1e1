"""Lance datasets written with pylance: fits equal in-memory statistics, apply to Parquet equals
``transform`` with ids carried, ``--update`` after appends reads only the new fragments and equals a full
refit, changed old fragments are refused, kill -9 resumes are bit-identical, bad vectors are exit 2."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import REPO, needs, optional_module, run_command  # noqa: E402

pytestmark = needs(
    "pyarrow", "lance", reason="Lance support needs pyarrow and pylance (pip install 'streamwhiten[lance]')"
)
pa = optional_module("pyarrow")
lance = optional_module("lance")
pq = optional_module("pyarrow.parquet")

from streamwhiten import ReadOptions, Whitener  # noqa: E402
from streamwhiten.core.model import load_model  # noqa: E402
from streamwhiten.errors import EXIT_BAD_INPUT, EXIT_NOTHING_TO_DO  # noqa: E402
from streamwhiten.io import fingerprint, input_kind, open_source  # noqa: E402
from streamwhiten.job import default_checkpoint  # noqa: E402
from streamwhiten.synthetic import generate_rows  # noqa: E402
from tests.engine.test_resume import kill_when, rerun_code, rows_done_of_checkpoint, spawn, statistics  # noqa: E402
from tests.io.test_parquet import rel, two_pass, vectors  # noqa: E402


def write_lance(path, rows, kind="fixed", first_id=0, mode="create", rows_per_file=1000, column="vector"):
    table = pa.table({"id": np.arange(first_id, first_id + rows.shape[0], dtype=np.int64), column: vectors(rows, kind)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lance.write_dataset(table, str(path), mode=mode, max_rows_per_file=rows_per_file)
    return f"{path}:{column}"


@pytest.fixture(scope="module")
def rows():
    return generate_rows(6000, 20, seed=4)


@pytest.mark.parametrize("kind", ["fixed", "list"])
@pytest.mark.parametrize("precision, bound", [("auto", 1e-6), ("float64", 1e-12)])
def test_fit_equals_two_pass_statistics(tmp_path, rows, kind, precision, bound):
    spec = write_lance(tmp_path / "v.lance", rows, kind)
    assert input_kind(str(tmp_path / "v.lance")) == "lance"
    with open_source(str(tmp_path / "v.lance")) as source:  # the only list column needs no name
        assert source.shape == (6000, 20) and source.label == spec
        np.testing.assert_array_equal(source.read(950, 2050), rows[950:2050])  # across fragments
    mean, cov = two_pass(rows)
    for chunk_rows in (None, 700):
        w = Whitener(precision=precision, read=ReadOptions(block_rows=chunk_rows)).fit(spec)
        assert w.n_samples_seen_ == 6000
        assert rel(w.mean_, mean) <= bound and rel(w.covariance_, cov) <= bound


def test_deleted_rows_are_not_read(tmp_path, rows):
    spec = write_lance(tmp_path / "v.lance", rows)
    lance.dataset(str(tmp_path / "v.lance")).delete("id >= 1500 AND id < 1600")
    kept = np.concatenate([rows[:1500], rows[1600:]])
    with open_source(spec) as source:
        assert source.n_rows == 5900
        np.testing.assert_array_equal(source.read(0, 5900), kept)
    mean, cov = two_pass(kept)
    w = Whitener(precision="float64").fit(spec)
    assert rel(w.covariance_, cov) <= 1e-12


def test_apply_to_parquet_keeps_ids(tmp_path, rows, run_cli):
    spec = write_lance(tmp_path / "v.lance", rows, "list")
    model_path = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model_path, "-k", 5, "-q")[0] == 0
    out = tmp_path / "out.parquet"
    code, _, err = run_cli("apply", model_path, spec, "-o", out, "--keep-columns", "id", "--chunk-rows", 1500, "-q")
    assert code == 0, err
    table = pq.read_table(out)
    np.testing.assert_array_equal(table.column("id").to_numpy(), np.arange(6000))
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(got, load_model(str(model_path)).transform(rows))
    assert pq.ParquetFile(out).metadata.num_row_groups == 4
    code, _, err = run_cli("apply", model_path, spec, "-o", out, "--keep-columns", "id", "--chunk-rows", 1500)
    assert code == EXIT_NOTHING_TO_DO
    code, _, err = run_cli("apply", model_path, spec, "-o", tmp_path / "x.parquet", "--keep-columns", "ids")
    assert code == EXIT_BAD_INPUT and "no column 'ids'" in err and "id (int64)" in err


@pytest.mark.slow
def test_apply_to_lance_output_keeps_ids_and_resumes_after_kill(tmp_path, rows, run_cli):
    from tests.engine.test_resume import rows_done_of_partial

    data = generate_rows(30_000, 32, seed=6)
    spec = write_lance(tmp_path / "v.lance", data, rows_per_file=7000)
    model_path = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model_path, "-k", 7, "-q")[0] == 0
    model = load_model(str(model_path))
    out = tmp_path / "out.lance"
    args = ["--keep-columns", "id", "--chunk-rows", 300, "--checkpoint-seconds", 0, "-q"]
    assert run_cli("apply", model_path, spec, "-o", out, *args)[0] == 0
    table = lance.dataset(str(out)).to_table()
    assert table.column_names == ["id", "embedding"]
    np.testing.assert_array_equal(table.column("id").to_numpy(), np.arange(30_000))
    expected = model.transform(data)
    np.testing.assert_allclose(
        np.stack(table.column("embedding").to_numpy(zero_copy_only=False)), expected, rtol=1e-5, atol=1e-5
    )  # blocks of 300 rows: BLAS may round otherwise
    with open_source(str(out)) as written:  # read back by the column it records, with the model's attributes
        assert written.dataset == "embedding" and written.attrs()["kept_columns"] == ["id"]
    assert run_cli("apply", model_path, spec, "-o", out, *args)[0] == EXIT_NOTHING_TO_DO
    killed = 0
    for target in (2_000, 15_000):
        output = str(tmp_path / f"out-{target}.lance")
        process = spawn("apply", model_path, spec, "-o", output, *args)
        was_killed = kill_when(process, lambda: rows_done_of_partial(output), target)
        if was_killed:
            killed += 1
            assert not os.path.exists(output)
        resumed = run_command("apply", model_path, spec, "-o", output, *args, "--json")
        assert resumed.returncode == rerun_code(was_killed), resumed.stderr
        again = lance.dataset(output).to_table()
        assert again.equals(table)
    assert killed >= 1


def test_update_after_append_reads_only_new_fragments_and_refuses_changed_ones(tmp_path, rows, run_cli):
    path = tmp_path / "v.lance"
    spec = write_lance(path, rows[:4000])
    model, full = tmp_path / "m.npz", tmp_path / "full.npz"
    assert run_cli("fit", spec, "-o", model, "--precision", "float64", "-q")[0] == 0
    with open_source(spec) as source:
        before = fingerprint(source)
    write_lance(path, rows[4000:], first_id=4000, mode="append")
    with open_source(spec) as source:
        after = fingerprint(source, 4000)
    assert after.layout_sha256 == before.layout_sha256 and after.version > before.version
    code, out, err = run_cli("fit", spec, "--update", model, "--precision", "float64", "--json")
    assert code == 0, err
    assert json.loads(out)["rows_read"] == 2000
    assert run_cli("fit", spec, "-o", full, "--precision", "float64", "-q")[0] == 0
    updated, refit = load_model(str(model)), load_model(str(full))
    assert updated.n_rows == refit.n_rows == 6000
    assert (
        rel(updated.state.scatter, refit.state.scatter) <= 1e-12 and rel(updated.state.mean, refit.state.mean) <= 1e-12
    )
    assert run_cli("fit", spec, "--update", model)[0] == EXIT_NOTHING_TO_DO
    # an old fragment changes (a row deleted, then one appended so the count still grows): refused
    lance.dataset(str(path)).delete("id = 10")
    write_lance(path, rows[:5], first_id=9000, mode="append")
    code, _, err = run_cli("fit", spec, "--update", model)
    assert code == EXIT_BAD_INPUT and "v.lance:vector" in err and "fragments holding them were changed" in err
    assert err.count("\n") == 1


@pytest.mark.slow
def test_fit_killed_resumes_bit_identical(tmp_path):
    data = generate_rows(40_000, 32, seed=8)
    spec = write_lance(tmp_path / "big.lance", data, rows_per_file=10_000)
    fit_args = ["--chunk-rows", 400, "--checkpoint-every", 1, "-q"]
    reference = tmp_path / "reference.npz"
    assert run_command("fit", spec, "-o", reference, *fit_args).returncode == 0
    expected = statistics(reference)
    killed = 0
    for target in (3_000, 17_000, 31_000):
        model = tmp_path / f"m-{target}.npz"
        checkpoint = default_checkpoint(str(model))
        process = spawn("fit", spec, "-o", model, *fit_args)
        was_killed = kill_when(process, lambda: rows_done_of_checkpoint(checkpoint), target)
        killed += was_killed
        assert run_command("fit", spec, "-o", model, *fit_args).returncode == rerun_code(was_killed)
        assert statistics(model) == expected
    assert killed >= 2


def test_bad_vectors_are_one_line_exit_2_naming_fragment_and_row(tmp_path, rows):
    lists = [list(map(float, row)) for row in rows[:3000].astype(np.float32)]

    def dataset(name, values, value_type=pa.float32()):
        table = pa.table({"id": np.arange(len(values)), "vector": pa.array(values, pa.list_(value_type))})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lance.write_dataset(table, str(tmp_path / name), max_rows_per_file=1000)
        return tmp_path / name

    model = tmp_path / "m.npz"
    cases = {
        "null.lance": (lists[:2100] + [None] + lists[2101:], "fragment 2, row 2,100: null vector"),
        "ragged.lance": (
            lists[:1500] + [lists[1500][:3]] + lists[1501:],
            "fragment 1, row 1,500: has 3 values, not 20",
        ),
        "nullvalue.lance": (
            lists[:10] + [[None] * 20] + lists[11:],
            "fragment 0, row 10: value 0 of the vector is null",
        ),
    }
    for name, (values, message) in cases.items():
        done = run_command("fit", dataset(name, values), "-o", model)
        assert done.returncode == EXIT_BAD_INPUT and done.stderr.count("\n") == 1, done.stderr
        assert f"{name}:vector: {message}" in done.stderr
    done = run_command("fit", dataset("ints.lance", [[1, 2]] * 10, pa.int64()), "-o", model)
    assert done.returncode == EXIT_BAD_INPUT and "int64 values, not float16" in done.stderr
    done = run_command("fit", f"{tmp_path / 'null.lance'}:nope", "-o", model)
    assert done.returncode == EXIT_BAD_INPUT and "has no vector column 'nope'" in done.stderr
    assert not model.exists()


def test_missing_pylance_is_one_line_naming_the_extra(tmp_path, rows):
    spec = write_lance(tmp_path / "v.lance", rows[:100])
    code = f"""
import sys
sys.modules.update(lance=None)
from streamwhiten.cli import main
sys.exit(main(['fit', {spec!r}, '-o', {str(tmp_path / "m.npz")!r}]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.count("\n") == 1 and "pip install 'streamwhiten[lance]'" in done.stderr
    assert os.path.exists(tmp_path / "v.lance")
