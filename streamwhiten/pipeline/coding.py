"""A model with a vector code as its storage: trained from its statistics (and a sample where the code needs one)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import params as _params
from ..errors import BadInputError
from ..progress import Progress, phase
from ..storage import Storage

if TYPE_CHECKING:
    from ..core.model import WhiteningModel

#: Rows of the input drawn (seeded, without replacement) to train a code that learns from data.
DEFAULT_CODE_SAMPLE_ROWS = 10_000


def with_codes(
    model: WhiteningModel | str,
    code: str | Storage,
    budget: int | None = None,
    *,
    sample: Any = None,
    sample_size: int = DEFAULT_CODE_SAMPLE_ROWS,
    seed: int = 0,
    output: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> WhiteningModel:
    """``model`` (or its file) with the vector code ``code`` as its storage: a codec of at most ``budget``
    bytes a vector (scalars included) trained for the model's unit-length outputs, recorded in the model.

    ``code`` is a name of ``streamwhiten.codes.CODES`` with ``budget``, or ``"NAME:BYTES"`` (``"eigen:24"``)
    or its `Storage`. Codes that need only statistics (``eigen``, ``bits-random``, ...) train from the
    model's state; those that learn from data (``faiss-*``, ``bits-itq``) from ``sample_size`` rows of
    ``sample`` (an input's spec, an open source, or an array) drawn with ``seed``, both recorded. ``output``:
    save the model there too (with ``overwrite``, replacing a model file of ours). ``progress`` is told each
    phase. A budget the code cannot take is refused before the sample is read.

    Examples
    --------
    >>> import numpy as np
    >>> from streamwhiten import Whitener, with_codes
    >>> rows = np.random.default_rng(0).standard_normal((2000, 16)) * np.linspace(3, 0.2, 16)
    >>> model = with_codes(Whitener(n_components=12).fit(rows).model_, "eigen:4")
    >>> model.storage.label, model.storage.bytes_per_vector(model.n_components)
    ('eigen-4B', 4)
    """
    from ..codes import NEEDS_SAMPLE, check_budget
    from ..codes.storage import train_for, with_codec
    from ..core.model import check_model_output, load_model, save_model

    if output is not None:  # before any work: a .npz name, replacing only a model file of ours
        check_model_output(os.fspath(output), overwrite)
    if isinstance(model, (str, os.PathLike)):
        model = load_model(os.fspath(model))
    code, budget = _code_and_budget(code, budget)
    _params.check("seed", seed)
    drawn = None
    if code in NEEDS_SAMPLE:
        check_budget(code, model.n_components, budget)  # a budget the code cannot take: before the sample is read
        drawn = _sample(code, sample, sample_size, int(seed), progress)
    used = 0 if drawn is None else int(drawn.shape[0])
    source = f"on {used:,} rows" if used else "from the statistics"
    with phase(progress, f"train {code}:{int(budget)} {source}", None):
        codec = train_for(model, code, int(budget), sample=drawn, sample_seed=int(seed), seed=int(seed))
    coded = with_codec(model, codec, code, sample_rows=used, sample_seed=int(seed) if used else 0)
    if output is not None:
        save_model(coded, os.fspath(output), overwrite=True)
    return coded


def _code_and_budget(code: str | Storage, budget: int | None) -> tuple[str, int]:
    """``("eigen", 24)`` of ``"eigen:24"``, its `Storage`, or ``"eigen"`` with ``budget`` (one of the two)."""
    from ..storage import not_a_code, parse_storage

    if isinstance(code, Storage) or ":" in code:
        if budget is not None:
            raise BadInputError(f"give the budget in the code ({str(code)!r}) or as budget, not both")
        named = parse_storage(code)
        if named.code is None:
            raise not_a_code(str(named))
        code, budget = named.code, named.budget
    if budget is None:
        raise BadInputError(f"give the {code} code a byte budget (e.g. {code}:24)")
    return code, int(budget)


def _sample(code: str, sample: Any, sample_size: int, seed: int, progress: Progress | None) -> Any:
    """``sample_size`` rows of ``sample`` drawn with ``seed`` (its size checked before a row is read)."""
    from ..codes import smallest_sample
    from ..io.sample import sample_rows

    if sample is None:
        raise BadInputError(f"the {code} code learns from a sample of the input rows: give sample (an input store)")
    if isinstance(sample_size, bool) or int(sample_size) != sample_size or sample_size < 2:
        raise BadInputError(f"a code's sample size is a whole number of at least 2, got {sample_size!r}")
    if sample_size < smallest_sample(code):  # fewer rows drawn than asked: the check after the draw says so
        raise BadInputError(
            f"the {code} code needs a sample of at least {smallest_sample(code)} rows, not sample_size={sample_size}",
            param="sample_size",
        )
    with phase(progress, "read the sample") as told:
        drawn = sample_rows(sample, int(sample_size), seed, told)
    if drawn.shape[0] < smallest_sample(code):  # the input holds fewer rows than the code trains on
        raise BadInputError(
            f"the {code} code needs a sample of at least {smallest_sample(code)} rows, but the sample input "
            f"holds {drawn.shape[0]}: give one with more rows",
            param="sample_size",
        )
    return drawn
