"""Codecs edited by hand with every checksum recomputed (issue #45): a codec field that no training could have
written (a step of Inf, bits out of range, a basis that is no rotation, index bytes faiss cannot read or an
index of another kind) is refused in one line naming the file and the field, exit 2 from the command line and
a ``ModelFileError`` from Python, never used; and a sample too small for a code is one line naming the
smallest size that works. The forged bytes are rebuilt here as ``Codec.to_bytes`` lays them out (magic,
version, JSON header, arrays, SHA-256), so each checksum holds and only the field is wrong."""

from __future__ import annotations

import hashlib
import json
import re
import struct

import numpy as np
import pytest
from conftest import write_h5
from user_files import snapshot

from streamwhiten import serving, with_codes
from streamwhiten._npz import read_npz, write_npz_atomic
from streamwhiten.codes import codec_from_bytes, smallest_sample
from streamwhiten.codes.base import FORMAT_VERSION, MAGIC, read_parts
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import BadInputError, ModelFileError

D = 16
ROWS = (np.random.default_rng(0).standard_normal((600, D)) @ np.diag(np.geomspace(3, 0.1, D)) + 2.0).astype(np.float32)


def rebuild(data: bytes, edit) -> bytes:
    """The codec bytes ``data`` with ``edit(record, arrays)`` applied, laid out again with a fresh SHA-256."""
    family, record, arrays = read_parts(data)
    edit(record, arrays)
    layout, payload = [], []
    for name, array in arrays.items():
        little = np.ascontiguousarray(array)
        little = little.astype(little.dtype.newbyteorder("<"))
        layout.append({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)})
        payload.append(little.tobytes())
    header = json.dumps({"family": family, "record": record, "arrays": layout}, sort_keys=True, separators=(",", ":"))
    body = MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header.encode() + b"".join(payload)
    return body + hashlib.sha256(body).digest()


def forge_model(source, target, data: bytes, record_edit=None) -> None:
    """The model file ``source`` with the codec bytes ``data``, the record's SHA-256 and the file's checksum
    recomputed as anyone can (``record_edit`` changes the codec's record in ``storage_json`` too)."""
    arrays = {k: np.asarray(v) for k, v in read_npz(str(source), "model file", "streamwhiten-model", 1).items()}
    arrays.pop("checksum", None)
    storage = json.loads(str(arrays["storage_json"]))
    storage["codec"]["sha256"] = hashlib.sha256(data).hexdigest()
    if record_edit is not None:
        record_edit(storage["codec"])
    arrays.update(storage_codec=np.frombuffer(data, np.uint8), storage_json=np.array(json.dumps(storage)))
    write_npz_atomic(str(target), arrays, "model file")


def _set(name, value):
    def edit(record, arrays):
        if name in arrays:
            arrays[name] = value(arrays[name]) if callable(value) else value
        else:
            record[name] = value

    return edit


def _first(value):
    """The array with its first entry set to ``value``."""
    return lambda old: np.where(np.arange(old.size).reshape(old.shape) == 0, value, old).astype(old.dtype)


#: linear (eigen:4) edits -> the codec field the one line names
LINEAR_EDITS = {
    "step-inf": (_set("step", lambda s: np.full_like(s, np.inf)), "step", "NaN or Inf"),
    "step-nan": (_set("step", _first(np.nan)), "step", "NaN or Inf"),
    "step-zero": (_set("step", _first(0.0)), "step", "positive"),
    "step-negative": (_set("step", lambda s: -s), "step", "positive"),
    "step-overflows": (_set("step", _first(1e308)), "step", "finite"),
    "bits-zero": (_set("bits", _first(0)), "bits", "1 to 8"),
    "bits-nine": (_set("bits", _first(9)), "bits", "1 to 8"),
    "bits-signed": (_set("bits", lambda b: b.astype(np.int8)), "bits", "bytes"),
    "basis-inf": (_set("basis", _first(np.inf)), "basis", "NaN or Inf"),
    "basis-scaled": (_set("basis", lambda b: 2 * b), "basis", "orthonormal"),
    "basis-shape": (_set("basis", lambda b: b[:-1]), "basis", "do not agree"),
    "mean-nan": (_set("mean", _first(np.nan)), "mean", "NaN or Inf"),
    "budget-zero": (_set("budget", 0), "budget", "at least 1"),
    "budget-below": (_set("budget", 1), "budget", "rows take"),
    "budget-text": (_set("budget", "4"), "budget", "whole number"),
    "kind": (_set("kind", "eigen2"), "kind", "one of"),
    "correction": (_set("correction", "yes"), "correction", "true or false"),
    "extra-array": (lambda record, arrays: arrays.update(extra=np.zeros(3)), "arrays", "mean, basis, bits and step"),
}


@pytest.fixture(scope="module")
def model():
    return finalize(stats.block_moments(ROWS.astype(np.float64)), beta=1.0, gamma=0.5, n_components=12)


@pytest.fixture(scope="module")
def eigen_model(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("eigen") / "good.npz"
    save_model(with_codes(model, "eigen:4"), str(path))
    return path


def _refused_everywhere(tmp_path, path, field: str, problem: str, run_cli) -> None:
    """``path`` is refused by serving.codec, load-and-use from Python, and ``apply``/``info`` in one line
    naming the file and the codec field, exit 2, writing nothing."""
    line = rf"{re.escape(str(path))}: model file field 'storage_codec': codec field '{field}' [^\n]*{problem}"
    with pytest.raises(ModelFileError, match=line):
        serving.codec(str(path))
    write_h5(tmp_path / "x.h5", ROWS[:50])
    before = snapshot(tmp_path)
    for args in (["apply", path, tmp_path / "x.h5", "-o", tmp_path / "out.h5"], ["info", path]):
        code, _, err = run_cli(*args)
        assert code == 2 and len(err.splitlines()) == 1 and re.search(line, err), (args, code, err)
    assert snapshot(tmp_path) == before  # nothing written


@pytest.mark.parametrize("case", LINEAR_EDITS)
def test_a_linear_codec_field_no_training_writes_is_refused(tmp_path, eigen_model, case, run_cli):
    edit, field, problem = LINEAR_EDITS[case]
    good = load_model(str(eigen_model)).storage.codec.data
    forged = rebuild(good, edit)
    with pytest.raises(ModelFileError, match=rf"^the codec's bytes: codec field '{field}' [^\n]*{problem}"):
        codec_from_bytes(forged)
    forge_model(eigen_model, tmp_path / "model.npz", forged)
    _refused_everywhere(tmp_path, tmp_path / "model.npz", field, problem, run_cli)


def _scaled_codebooks(blob):
    """A faiss PQ index's bytes with its codebooks scaled far beyond any unit vectors' (finite)."""
    import faiss

    index = faiss.deserialize_index(blob)
    pq = faiss.downcast_index(index).pq
    faiss.copy_array_to_vector(faiss.vector_to_array(pq.centroids) * 1e6, pq.centroids)
    return faiss.serialize_index(index)


#: finite fields that no training on unit vectors writes -> the model file's codec, refused where it is used
UNIT_EDITS = {
    "step-huge": ("eigen", _set("step", lambda s: s * 1e10), "step", "of component 0 is .* beyond the"),
    "mean-long": ("eigen", _set("mean", lambda m: m * 1e6 + 1.0), "mean", "beyond the 1 of a mean of unit vectors"),
    "faiss-mean-long": ("faiss", _set("mean", lambda m: m * 1e6 + 1.0), "mean", "beyond the 1 of a mean"),
    "faiss-codebooks": ("faiss", _set("index", _scaled_codebooks), "index", "a trained value of .* beyond the 4"),
}


@pytest.mark.parametrize("case", UNIT_EDITS)
def test_a_model_codec_scaled_beyond_any_unit_vectors_is_refused(tmp_path, request, case, run_cli):
    """The codes a model records code its outputs at unit length: a finite step of 1e10 (the retry of a step
    of Inf) or a mean far from the unit ball would code every row alike, so the model's codec is refused
    where it is used; the codec alone (a codec of other vectors may hold them) decodes."""
    family, edit, field, problem = UNIT_EDITS[case]
    if family == "faiss":
        pytest.importorskip("faiss")
    source = request.getfixturevalue("eigen_model" if family == "eigen" else "faiss_model")
    forged = rebuild(load_model(str(source)).storage.codec.data, edit)
    codec_from_bytes(forged)  # every field is a field some training writes
    forge_model(source, tmp_path / "model.npz", forged)
    _refused_everywhere(tmp_path, tmp_path / "model.npz", field, problem, run_cli)


def test_the_step_of_inf_reproducer_no_longer_writes_one_code_for_every_row(tmp_path, eigen_model, run_cli):
    """Issue #45's reproducer: before, ``apply`` wrote the same code for every row and exited 0."""
    good = load_model(str(eigen_model)).storage.codec.data
    forge_model(eigen_model, tmp_path / "model.npz", rebuild(good, LINEAR_EDITS["step-inf"][0]))
    write_h5(tmp_path / "x.h5", ROWS[:50])
    code, _, err = run_cli("apply", tmp_path / "model.npz", tmp_path / "x.h5", "-o", tmp_path / "out.h5")
    assert code == 2 and "codec field 'step' holds NaN or Inf" in err and not (tmp_path / "out.h5").exists()


def test_a_record_that_names_another_code_than_its_bytes_is_refused(tmp_path, eigen_model, run_cli):
    good = load_model(str(eigen_model)).storage.codec.data
    forge_model(eigen_model, tmp_path / "model.npz", good, lambda record: record.update(code="eigen-iso"))
    with pytest.raises(ModelFileError, match=r"record says eigen-iso of 4 bytes .* its bytes hold eigen of 4 bytes"):
        serving.codec(str(tmp_path / "model.npz"))
    code, _, err = run_cli("info", tmp_path / "model.npz")
    assert code == 2 and len(err.splitlines()) == 1 and "model.npz: model file field 'storage_codec'" in err


def test_what_training_writes_passes_for_every_code(model):
    """The checks refuse no code a training writes (every family, with and without correction)."""
    pytest.importorskip("faiss")
    from streamwhiten.codes import CODES, record_codec
    from streamwhiten.codes.faiss_codes import one_omp_thread
    from streamwhiten.codes.storage import train_for, with_codec

    for name in CODES:
        budget = {"faiss-rabitq1": 12, "faiss-rabitq2": 24, "faiss-rabitq4": 48}.get(name, 6)
        if name.startswith("bits-"):  # 12 components hold one byte of sign bits
            budget = 3 if name.endswith("+f") else 1
        fast = {"iterations": 2, "opq_iterations": 2, "opq_initial_iterations": 2} if name.startswith("faiss-") else {}
        with one_omp_thread():  # OPQ's training, cut short: the checks, not the code's quality, are tested
            codec = train_for(model, name, budget, sample=ROWS[:300], **fast)
        coded = with_codec(model, codec, name, sample_rows=300)
        again = record_codec(coded.storage.codec, model.n_components)
        assert again.to_bytes() == codec.to_bytes() and again.label == coded.storage.codec.label, name


# ------------------------------------------------------------------------------------------- faiss


@pytest.fixture(scope="module")
def faiss_model(model, tmp_path_factory):
    pytest.importorskip("faiss", reason="faiss is not installed: pip install faiss-cpu")
    path = tmp_path_factory.mktemp("faiss") / "good.npz"
    save_model(with_codes(model, "faiss-pq:6", sample=ROWS, sample_size=600), str(path))
    return path


def _index_bytes(index) -> np.ndarray:
    import faiss

    return faiss.serialize_index(index)


def _other_index(kind: str):
    """The serialized bytes of a trained faiss index of 12 dims that is not a PQ of 6 sub-quantisers."""
    import faiss

    train = np.random.default_rng(1).standard_normal((300, 12)).astype(np.float32)
    if kind == "sq8":
        index = faiss.IndexScalarQuantizer(12, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_L2)
    elif kind == "pq4":
        index = faiss.IndexPQ(12, 4, 8, faiss.METRIC_L2)
    else:  # a PQ of the right layout whose codebooks hold NaN
        index = faiss.IndexPQ(12, 6, 8, faiss.METRIC_L2)
    index.train(train)
    if kind == "nan":
        centroids = faiss.vector_to_array(index.pq.centroids)
        centroids[0] = np.nan
        faiss.copy_array_to_vector(centroids, index.pq.centroids)
    if kind == "filled":
        index.add(train[:3])
    return _index_bytes(index)


FAISS_EDITS = {
    "garbage": (lambda a: np.frombuffer(np.random.default_rng(2).bytes(a.size), np.uint8), "cannot read"),
    "truncated": (lambda a: a[: a.size // 2].copy(), "cannot read"),
    "another-kind": (lambda a: _other_index("sq8"), "IndexScalarQuantizer, not the index of a pq code"),
    "another-layout": (lambda a: _other_index("pq4"), "4 sub-quantisers of 8 bits, not 6"),
    "nan-codebook": (lambda a: _other_index("nan"), "NaN or Inf in its codebooks"),
    "not-empty": (lambda a: _other_index("filled"), "3 rows"),
}


@pytest.mark.parametrize("case", FAISS_EDITS)
def test_a_faiss_codec_whose_index_is_not_the_one_it_names_is_refused(tmp_path, faiss_model, case, run_cli):
    change, problem = FAISS_EDITS[case]
    good = load_model(str(faiss_model)).storage.codec.data
    forged = rebuild(good, _set("index", change))
    with pytest.raises(ModelFileError, match=rf"codec field 'index' [^\n]*{re.escape(problem)}"):
        codec_from_bytes(forged)
    forge_model(faiss_model, tmp_path / "model.npz", forged)
    _refused_everywhere(tmp_path, tmp_path / "model.npz", "index", re.escape(problem), run_cli)


@pytest.mark.parametrize(
    "edit, field",
    [
        (_set("mean", _first(np.inf)), "mean"),
        (lambda record, arrays: (record.update(projected=True), arrays.update(basis=np.eye(12))), "projected"),
        (_set("kind", "pq7"), "kind"),
        (_set("budget", 13), "budget"),
    ],
)
def test_a_faiss_codec_field_no_training_writes_is_refused(faiss_model, edit, field):
    good = load_model(str(faiss_model)).storage.codec.data
    with pytest.raises(ModelFileError, match=rf"^the codec's bytes: codec field '{field}' "):
        codec_from_bytes(rebuild(good, edit))


# ------------------------------------------------------------------------------------------ samples


@pytest.mark.parametrize(
    "code, smallest", [("faiss-pq:4", 256), ("faiss-opq:4", 256), ("faiss-sq8:8", 2), ("bits-itq:1", 2)]
)
def test_a_sample_smaller_than_a_code_trains_on_names_the_smallest_that_works(tmp_path, model, code, smallest, run_cli):
    """Issue #45: ``codes MODEL faiss-pq:4`` on 60 rows, or with ``--sample-size 2``, ended in faiss's
    RuntimeError (exit 1). Now one line names the smallest sample; the smallest itself trains."""
    pytest.importorskip("faiss")
    name = code.split(":")[0]
    assert smallest_sample(name) == smallest
    save_model(model, str(tmp_path / "m.npz"))
    few = max(1, min(60, smallest - 1))
    write_h5(tmp_path / "few.h5", ROWS[:few])
    before = snapshot(tmp_path)
    code_, _, err = run_cli(
        "codes", tmp_path / "m.npz", code, "--sample", tmp_path / "few.h5", "-o", tmp_path / "c.npz"
    )
    failure = [line for line in err.splitlines() if not re.match(r"\d{4}-\S+ streamwhiten: codes: ", line)]
    assert code_ == 2 and len(failure) == 1, err  # one line besides the timed phase lines of a piped run
    assert f"needs a sample of at least {smallest} rows, but the sample input holds {few}" in err, err
    if smallest > 2:
        code_, _, err = run_cli(
            "codes",
            tmp_path / "m.npz",
            code,
            "--sample",
            tmp_path / "few.h5",
            "--sample-size",
            "2",
            "-o",
            tmp_path / "c.npz",
        )
        assert code_ == 2 and err.strip().endswith(f"at least {smallest} rows, not --sample-size 2"), err
    assert snapshot(tmp_path) == before
    with pytest.raises(BadInputError, match=f"at least {smallest} rows"):
        with_codes(model, code, sample=ROWS[: smallest - 1])
    from streamwhiten.codes.storage import train_for

    with pytest.raises(
        BadInputError, match=rf"^the {name} code needs a sample of at least {smallest} rows \(.*\), got"
    ):
        train_for(model, name, int(code.split(":")[1]), sample=ROWS[: smallest - 1])  # as eval and tune train
    assert with_codes(model, code, sample=ROWS[:smallest], sample_size=smallest).storage.codec.sample_rows == smallest


def test_an_opq_matrix_that_is_no_rotation_is_refused():
    """OPQ learns an orthogonal rotation: an index whose matrix is scaled (finite, of the right shape) is no
    index OPQ trains."""
    faiss = pytest.importorskip("faiss")
    from streamwhiten.codes.faiss_codes import one_omp_thread

    rows = ROWS[:300].astype(np.float64)
    with one_omp_thread():
        codec = train_codec_fast("faiss-opq", rows)

    def scaled(blob):
        index = faiss.deserialize_index(blob)
        rotation = faiss.downcast_VectorTransform(index.chain.at(0))
        faiss.copy_array_to_vector(faiss.vector_to_array(rotation.A) * 1.5, rotation.A)
        return faiss.serialize_index(index)

    assert codec_from_bytes(codec.to_bytes()).to_bytes() == codec.to_bytes()
    with pytest.raises(ModelFileError, match=r"codec field 'index' holds an OPQ matrix that is no rotation"):
        codec_from_bytes(rebuild(codec.to_bytes(), _set("index", scaled)))


def train_codec_fast(name, rows):
    """The code ``name`` (8 bytes) of ``rows``, its k-means and OPQ cut short: the checks, not the quality."""
    from streamwhiten.codes import train_codec

    return train_codec(name, rows.mean(0), np.cov(rows.T), 8, sample=rows, iterations=2, opq_iterations=2)
