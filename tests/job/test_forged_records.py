"""A job's records edited by hand (issue #45): a manifest whose checksum was recomputed over a field no run
writes (a path holding a NUL byte, an identity holding a control character) is refused by ``run`` and by
``published()`` in one line naming the manifest and the field, exit 2, nothing changed; a job file whose value
holds a NUL byte (TOML's ``\\u0000``) too. And the reader's refusal of a part is one plain sentence that
blames a newer version only where the part is missing."""

from __future__ import annotations

import json
import os
import re
import shutil

import h5py
import numpy as np
import pytest
from conftest import run_command
from user_files import snapshot

from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError, ModelFileError
from streamwhiten.job import published, run_job_file
from streamwhiten.job.manifest import manifest_path
from streamwhiten.records import json_checksum

D = 8


def write_job(directory, n_inputs=1, output="out/{stem}.h5") -> str:
    """A small job (inputs of 300 rows each, k = 4) published once."""
    (directory / "shards").mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, n_inputs + 1):
        with h5py.File(directory / "shards" / f"day-{i}.h5", "w") as handle:
            handle.create_dataset("emb", data=(rng.standard_normal((300, D)) * np.arange(1, D + 1)).astype(np.float32))
    job = directory / "job.toml"
    job.write_text(
        'name = "pub"\n[input]\npaths = ["shards/day-*.h5"]\n[model]\npath = "models/m.npz"\nn_components = 4\n'
        f'[apply]\noutput = "{output}"\n[publish]\n'
    )
    report = run_job_file(str(job))
    assert report.published_version == 1
    return str(job)


def forge(model: str, where: str, change) -> None:
    """The manifest beside ``model`` with the field ``where`` (``inputs.0.parts.0.path``) changed and its
    checksum recomputed, as anyone can."""
    path = manifest_path(model)
    data = json.loads(open(path).read())
    *keys, last = [int(key) if key.isdigit() else key for key in where.split(".")]
    target = data
    for key in keys:
        target = target[key]
    target[last] = change(target[last])
    data.pop("checksum")
    data["checksum"] = json_checksum(data)
    open(path, "w").write(json.dumps(data))


#: fields of the manifest -> how the one line names them
FIELDS = {
    "inputs.0.parts.0.path": r"inputs\[0\]\.parts\[0\]\.path holds a NUL byte",
    "inputs.0.spec": r"inputs\[0\]\.spec holds a NUL byte",
    "inputs.0.source.path": r"inputs\[0\]\.source\.path holds a NUL byte",
    "setting.output": r"setting\.output holds a NUL byte",
    "job_id": r"job_id holds a NUL byte",
}


@pytest.mark.parametrize("where", FIELDS)
def test_a_manifest_field_holding_a_nul_byte_is_refused_in_one_line(tmp_path, where):
    """Issue #45's reproducer: a part path holding a NUL byte ended in ``internal error: ValueError: embedded
    null byte`` (exit 1); a spec holding one was read by ``published()`` as a bare ``ValueError``."""
    job = write_job(tmp_path)
    model = str(tmp_path / "models" / "m.npz")
    forge(model, where, lambda text: text + "\x00x")
    before = unlocked(snapshot(tmp_path))
    result = run_command("run", job)
    errors = [line for line in result.stderr.splitlines() if "error" in line]  # the log says "lock taken" first
    line = rf"^streamwhiten: error: {re.escape(manifest_path(model))}: not a manifest .*{FIELDS[where]}"
    assert result.returncode == EXIT_BAD_INPUT and len(errors) == 1, result.stderr
    assert re.search(line, errors[0]) and result.stderr.splitlines()[-1] == errors[0], result.stderr
    with pytest.raises(ModelFileError, match=FIELDS[where]):
        published(model).read(str(tmp_path / "shards" / "day-1.h5"))
    assert unlocked(snapshot(tmp_path)) == before  # nothing changed


def unlocked(found: dict) -> dict:
    """A snapshot without the job's lock file (a run takes it, refused or not)."""
    return {name: entry for name, entry in found.items() if not name.endswith(".lock")}


def test_a_job_file_value_holding_a_nul_byte_is_refused_naming_the_key(tmp_path, run_cli):
    (tmp_path / "job.toml").write_text(
        'name = "j"\n[input]\npaths = ["a.h5"]\n[model]\npath = "m\\u0000.npz"\n[apply]\noutput = "out/{stem}.h5"\n'
    )
    code, _, err = run_cli("run", tmp_path / "job.toml")
    assert code == EXIT_BAD_INPUT and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'job.toml'}: path in [model] holds a NUL byte" in err, err


def test_a_spec_holding_a_nul_byte_is_one_line_from_python(tmp_path):
    from streamwhiten import apply

    with pytest.raises(BadInputError, match=r"holds a NUL byte, which no path can hold"):
        apply(str(tmp_path / "m.npz"), str(tmp_path / "a.h5\x00"), str(tmp_path / "o.h5"))


def test_a_part_swapped_for_another_inputs_is_refused_in_one_plain_sentence(tmp_path):
    """The refusal says what is wrong and does not blame a newer version, which was never published."""
    write_job(tmp_path, n_inputs=2)
    model = str(tmp_path / "models" / "m.npz")
    part, other = tmp_path / "out" / "day-1.v1.h5", tmp_path / "out" / "day-2.v1.h5"
    os.remove(part)
    shutil.copy(other, part)
    with pytest.raises(BadInputError) as caught:
        published(model).read(str(tmp_path / "shards" / "day-1.h5"))
    message = str(caught.value)
    assert message == (
        f"{part}: this part of published version 1 holds the rows of another input (../shards/day-2.h5, not "
        "../shards/day-1.h5), so it is not read"
    ), message
    assert "is holds" not in message and "newer version" not in message
    part.write_bytes(b"not an HDF5 file")  # damaged
    with pytest.raises(
        BadInputError, match=r"this part of published version 1 is unreadable \(.*\), so it is not read$"
    ):
        published(model).read(str(tmp_path / "shards" / "day-1.h5"))
    os.remove(part)  # a missing part: the one case where a newer version may have deleted it
    with pytest.raises(
        BadInputError, match=r"this part of published version 1 is missing, so it is not read; if a newer"
    ):
        published(model).read(str(tmp_path / "shards" / "day-1.h5"))
