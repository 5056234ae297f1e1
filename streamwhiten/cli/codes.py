"""``streamwhiten codes``: give a model a vector code as its storage."""

from __future__ import annotations

from typing import Any

import click

from ..errors import BadInputError
from ..params import PARAMS
from ..storage import CodecRecord, Storage, not_a_code, parse_storage
from ._common import emit, progress_bar
from ._options import json_option, quiet_option

#: The plain storages a ``--dtype`` takes beside a code.
DTYPES: tuple[str, ...] = tuple(str(choice) for choice in PARAMS["dtype"].choices)


def code_names() -> str:
    """The code names a ``NAME:BYTES`` takes, for a help text (from `streamwhiten.codes.CODES`)."""
    from ..codes import CODES

    return ", ".join(CODES)


class CodeType(click.ParamType):
    """A vector code ``NAME:BYTES`` (``eigen:24``), parsed into a `Storage`; refused in one line naming the
    codes (`StorageType` takes the plain storages too, refused in the dtype's words)."""

    name = "NAME:BYTES"
    codes_only = True

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            if self.codes_only and ":" not in str(value):  # a plain storage where a code is wanted
                raise not_a_code(value)
            return parse_storage(value)
        except BadInputError as exc:
            self.fail(str(exc), param, ctx)  # the parameter's words name the codes too


class StorageType(CodeType):
    """``--dtype``: a storage (float32, float16, int8, binary) or a code ``NAME:BYTES``; completes the storages."""

    name = "DTYPE|NAME:BYTES"
    codes_only = False

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "[" + "|".join(DTYPES) + "|NAME:BYTES]"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(name) for name in DTYPES if name.startswith(incomplete)]


@click.command(name="codes")
@click.argument("model_path")
@click.argument("code", type=CodeType())
@click.option(
    "--sample",
    "sample",
    default=None,
    metavar="INPUT",
    help="The input store (a spec as fit takes it) whose rows a code that learns from data (faiss-*, "
    "bits-itq) trains on, mapped by the model.",
)
@click.option(
    "--sample-size",
    type=click.IntRange(2),
    default=None,
    help="Rows drawn from --sample, without replacement [default: 10000, or all of them].",
)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Seed of the sample and the code.")
@click.option("-o", "--output", "output_path", default=None, help="Write the model with its code to this new file.")
@click.option("--in-place", is_flag=True, help="Write the code into MODEL_PATH itself.")
@click.option("--overwrite", is_flag=True, help="Let -o replace an existing model file written by streamwhiten.")
@quiet_option
@json_option
def codes(
    model_path: str,
    code: Storage,
    sample: str | None,
    sample_size: int | None,
    seed: int,
    output_path: str | None,
    in_place: bool,
    overwrite: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Train the vector code CODE (NAME:BYTES, e.g. eigen:24) for the outputs of MODEL_PATH and record it
    as the model's storage, so that `eval` searches it, `export` writes it and `serving.codec` reads it.

    \b
    NAME (BYTES a vector, per-vector scalars included):
      eigen, eigen-iso, eigen+f      bits per principal component by eigenvalue (from the statistics)
      bits-random[+f], bits-pca[+f]  sign bits after a seeded random rotation / of the principal axes
      bits-itq[+f]                   sign bits after ITQ, learnt on --sample
      faiss-pq, faiss-opq, faiss-rabitq1/2/4, faiss-sq4, faiss-sq8  faiss's codes, trained on --sample

    The codec codes the map's outputs at unit length (as search stores them); codes trained from the
    statistics need no data pass, the others a seeded sample of the input (its size and seed recorded).

    \b
    Examples:
      streamwhiten codes model.npz eigen:24 -o model-codes.npz
      streamwhiten codes model.npz faiss-opq:24 --sample corpus.h5:/emb --in-place
    """
    from ..pipeline import DEFAULT_CODE_SAMPLE_ROWS, with_codes

    target = _target(model_path, sample, output_path, in_place, overwrite)
    _check_sample(code, sample, sample_size)
    with progress_bar("codes", quiet) as progress:
        model = with_codes(
            model_path,
            code,
            sample=sample,
            sample_size=DEFAULT_CODE_SAMPLE_ROWS if sample_size is None else sample_size,
            seed=seed,
            output=target,
            overwrite=True,
            progress=progress,
        )
    storage = model.storage
    assert storage is not None and storage.codec is not None  # with_codes records one
    emit(as_json, dict(storage.codec.to_dict(), model=target), _lines(storage.codec, target))


def _target(model_path: str, sample: str | None, output_path: str | None, in_place: bool, overwrite: bool) -> str:
    """The model file to write the code into (``-o`` or ``--in-place``), checked before any work."""
    from ..core.model import check_model_output

    if output_path and in_place:
        raise BadInputError("give -o/--output or --in-place, not both")
    if not (output_path or in_place):
        raise BadInputError("give -o/--output (a new model file) or --in-place")
    if output_path:
        from ..io import refuse_input_overlap

        refuse_input_overlap(
            {output_path: "model with codes (use --in-place to update the model itself)"}, [model_path, sample]
        )
    check_model_output(output_path or model_path, overwrite=bool(in_place or overwrite))
    return output_path or model_path


def _check_sample(code: Storage, sample: str | None, sample_size: int | None) -> None:
    """A code that learns from data needs ``--sample``; ``--sample-size`` needs it too."""
    from ..codes import NEEDS_SAMPLE

    if code.code in NEEDS_SAMPLE and sample is None:
        raise BadInputError(f"the {code} code learns from a sample of the input rows: give --sample INPUT")
    if sample_size is not None and sample is None:
        raise BadInputError("--sample-size: give --sample (an input store) to draw from")


def _lines(record: CodecRecord, target: str) -> list[str]:
    """The code trained, what it was trained from, and the file written."""
    trained = (
        f"a sample of {record.sample_rows:,} rows (seed {record.sample_seed})"
        if record.sample_rows
        else "the statistics"
    )
    return [
        f"code       {record.label}: {record.bytes_per_vector:,} bytes per vector (per-vector scalars included), "
        f"{record.model_bytes:,} bytes per model (rotations, codebooks)",
        f"trained    for the unit-length outputs at k={record.n_features}, from {trained}",
        f"wrote      {target}",
    ]
