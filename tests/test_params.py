"""One declarative parameter spec: the same value is refused in the same words from Python, from the
command line and from a job file (exit 2), and the estimator's defaults are the declared ones."""

import inspect

import numpy as np
import pytest
from conftest import anisotropic, run_command, write_h5

from streamwhiten import ReadOptions, Whitener
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError
from streamwhiten.params import PARAMS, check


@pytest.mark.parametrize(
    "name, value, flag, toml, message",
    [
        ("beta", 1.5, "--beta", "1.5", "beta must be a number in [0, 1], got 1.5"),
        ("gamma", -0.5, "--gamma", "-0.5", "gamma must be a number in [0, 1], got -0.5"),
        ("variance", 0.0, "--variance", "0.0", "variance must be a fraction in (0, 1], got 0.0"),
        ("eps", 0.0, "--eps", "0.0", "eps must be a positive finite number, got 0.0"),
        ("block_rows", 0, "--block-rows", "0", "block_rows must be a whole number of at least 1, got 0"),
        (
            "precision",
            "float16",
            "--precision",
            '"float16"',
            "precision must be one of 'auto', 'float32', 'float64', got 'float16'",
        ),
    ],
)
def test_a_bad_value_reads_the_same_from_python_the_cli_and_a_job_file(tmp_path, name, value, flag, toml, message):
    store = write_h5(tmp_path / "in.h5", anisotropic(50, 4).astype(np.float32))
    with pytest.raises(BadInputError) as caught:
        given = {"read": ReadOptions(**{name: value})} if name == "block_rows" else {name: value}
        Whitener(**given).fit(anisotropic(50, 4))
    assert str(caught.value) == message

    result = run_command("fit", store, "-o", tmp_path / "m.npz", flag, toml.strip('"'))
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr == f"streamwhiten: error: Invalid value for '{flag}': {message} (see --help)\n"

    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["{store.split(":")[0]}"]\n[model]\npath = "m.npz"\n{name} = {toml}\n')
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip().endswith(f"{job}: {name} in [model] {message[len(name) + 1 :]}"), result.stderr
    assert not (tmp_path / "m.npz").exists()


#: The estimator's own defaults where a declared one does not fit it: ``dtype`` None returns the floats
#: it computes in (float64 for float64 input, as scikit-learn expects), where apply's default is float32;
#: ``read`` None reads as ``ReadOptions()`` does.
ESTIMATOR_DEFAULTS = {"dtype": None, "read": None}


def test_the_estimator_declares_the_specs_defaults():
    signature = inspect.signature(Whitener)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())
    for name, parameter in signature.parameters.items():
        expected = ESTIMATOR_DEFAULTS[name] if name in ESTIMATOR_DEFAULTS else PARAMS[name].default
        assert parameter.default == expected, name
    assert PARAMS["dtype"].accepts(None)  # the estimator's default is one the parameter allows


@pytest.mark.parametrize(
    "name, good, bad",
    [
        ("n_components", [1, np.int64(7), None], [0, -1, 2.0, True, "3"]),
        ("threads", [1, 16, -1, None], [0, -2, 1.5, False]),
        ("checkpoint_seconds", [0.001, 60, np.float32(1)], [0, -1.0, float("nan"), float("inf"), "60"]),
        ("progress_seconds", [0, 0.5], [-0.1]),
        ("skip_nonfinite", [True, False, np.bool_(True)], [0, 1, "yes", None]),
        ("zarr_format", [2, 3], [1, 4, "3"]),
        ("variance", [1.0, 0.5, 1], [0, 1.01, float("nan")]),
    ],
)
def test_each_constraint(name, good, bad):
    for value in good:
        assert check(name, value) is value
    for value in bad:
        with pytest.raises(
            BadInputError, match=rf"^{name}.* must be {PARAMS[name].text.replace('(', '.').replace(')', '.')}, got "
        ):
            check(name, value)
