"""``--overwrite`` does what its help says (issue #45): ``apply`` and ``export`` keep an output that is up to
date, with the flag too (exit 3, "nothing to do", the file untouched), so a nightly script that reads 3 as
nothing to do sees it and pays no rewrite; the flag replaces an output of ours that is not up to date. The
help and docs/exit-codes.md say so."""

from __future__ import annotations

import os
import re

import numpy as np
from conftest import REPO, anisotropic, write_h5
from user_files import snapshot

from streamwhiten.errors import EXIT_NOTHING_TO_DO, EXIT_OK


def test_apply_and_export_keep_an_up_to_date_output_with_overwrite_too(tmp_path, run_cli):
    store = write_h5(tmp_path / "in.h5", anisotropic(300, 6, seed=3).astype(np.float32))
    model = tmp_path / "m.npz"
    assert run_cli("fit", store, "-o", model, "-q")[0] == EXIT_OK
    for command, out in (("apply", tmp_path / "out.h5"), ("export", tmp_path / "map.npz")):
        args = [command, model, store, "-q"] if command == "apply" else [command, model]  # export has no -q
        assert run_cli(*args, "-o", out)[0] == EXIT_OK
        os.utime(out, (1_000_000, 1_000_000))  # a rewrite would show in the time, whatever the bytes
        before = snapshot(tmp_path)
        for extra in ((), ("--overwrite",)):
            code, _, err = run_cli(*args, "-o", out, *extra)
            assert code == EXIT_NOTHING_TO_DO, (command, extra, err)
            assert err.startswith(f"streamwhiten: nothing to do: {out} is up to date") and len(err.splitlines()) == 1
            assert "--overwrite replaces only an" in err and "delete it to write it again" in err, err
            assert snapshot(tmp_path) == before and os.stat(out).st_mtime == 1_000_000
        # another setting: not up to date, so --overwrite replaces it
        code, _, err = run_cli(*args, "-o", out, "-k", "3", "--overwrite")
        assert code == EXIT_OK, (command, err)
        assert os.stat(out).st_mtime != 1_000_000


def test_the_help_and_the_exit_codes_say_an_up_to_date_output_is_kept(run_cli):
    for command in ("apply", "export"):
        _, help_text, _ = run_cli(command, "--help")
        flat = " ".join(help_text.split())
        assert re.search(
            r"--overwrite Replace an existing .* that is not up to date \(one that is up to date is kept, "
            r"with this flag too: exit 3",
            flat,
        ), flat
    table = (REPO / "docs" / "exit-codes.md").read_text()
    assert "`apply` or `export` whose output is, `--overwrite` or not" in table
