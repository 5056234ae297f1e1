"""The Examples in the public docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "streamwhiten",
    "streamwhiten.pipeline",
    "streamwhiten.whitener",
    "streamwhiten.core.stats",
    "streamwhiten.core.model",
    "streamwhiten.core.staleness",
    "streamwhiten.core.quantize",
    "streamwhiten.codes",
    "streamwhiten.serving",
    "streamwhiten.params",
    "streamwhiten.options",
    "streamwhiten.storage",
    "streamwhiten.progress",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples failed in {name}"
    if name in (
        "streamwhiten.whitener",
        "streamwhiten.core.stats",
        "streamwhiten.core.model",
        "streamwhiten.core.staleness",
        "streamwhiten.core.quantize",
        "streamwhiten.progress",
    ):
        assert result.attempted > 0, f"{name} has no Examples"
