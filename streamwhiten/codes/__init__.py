"""Vector codes for a byte budget, behind one `Codec` interface, trained from the exact mean and
covariance (and a sample where a code learns from data): the tool's own (`CODES`: ``eigen``, ``eigen-iso``
for isotropic queries, ``bits-random``, ``bits-itq``, ``bits-pca``, each ``+f`` with the per-vector
correction) and faiss's (``faiss-pq``, ``faiss-opq``, ``faiss-rabitq1/2/4``, ``faiss-sq4``, ``faiss-sq8``).

Examples
--------
>>> import numpy as np
>>> from streamwhiten.codes import train_codec, codec_from_bytes
>>> rng = np.random.default_rng(0)
>>> x = rng.standard_normal((1000, 16)) * np.linspace(3, 0.1, 16)
>>> codec = train_codec("eigen", x.mean(0), np.cov(x.T), 6)
>>> codec.bytes_per_vector, codec.encode(x[:3]).shape
(6, (3, 6))
>>> codec_from_bytes(codec.to_bytes()).label
'eigen-6B'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from ..errors import BadInputError, ModelFileError
from ..storage import CODES
from .base import Codec, read_parts

if TYPE_CHECKING:
    from ..storage import CodecRecord

#: The codes that learn from a sample of the vectors (the others need only the statistics).
NEEDS_SAMPLE: tuple[str, ...] = tuple(name for name in CODES if name.startswith(("faiss-", "bits-itq")))
#: The codes ``tune --max-bytes`` sweeps by default (faiss's where installed; ``tune --help`` lists them).
TUNE_CODES: tuple[str, ...] = tuple(name for name in CODES if name not in ("bits-itq+f", "bits-pca", "bits-pca+f"))


def code_size(name: str, n_features: int, budget: int) -> int | None:
    """The bytes a row of the largest ``name`` code within ``budget`` takes (None: none fits), by the
    family's own size function, so `train_codec` at that size trains that code; faiss's sizes need faiss."""
    if name not in CODES:
        raise BadInputError(f"unknown code {name!r}: one of {', '.join(CODES)}")
    if name.startswith("faiss-"):
        from .faiss_codes import faiss_bytes

        faiss_bytes(name[len("faiss-") :], 1, 1)  # faiss missing is its own one-line error, not "does not fit"
    try:
        return _largest_size(name, int(n_features), int(budget))
    except BadInputError:  # below the smallest code
        return None


def _largest_size(name: str, n_features: int, budget: int) -> int:
    """`code_size`'s bytes, or `BadInputError` below the smallest code."""
    correction = name.endswith("+f")
    if name.startswith("eigen"):
        from .linear import eigen_bits, linear_bytes

        return linear_bytes(eigen_bits(n_features, budget, correction), correction)
    if name.startswith("bits-"):
        from .linear import CORRECTION_BYTES, linear_bytes, sign_bits

        whole = n_features // 8 + (CORRECTION_BYTES if correction else 0)  # one bit a feature, whole bytes
        return linear_bytes(sign_bits(n_features, min(budget, whole), correction), correction)
    from .faiss_codes import faiss_bytes, layout_for

    kind = name[len("faiss-") :]
    if kind in ("pq", "opq"):  # a byte a sub-space, at most a sub-space a feature
        budget = min(budget, n_features)
    return faiss_bytes(kind, *layout_for(kind, n_features, budget))


def smallest_sample(name: str) -> int:
    """The fewest sample rows the code ``name`` trains on (0: from the statistics alone)."""
    if name not in NEEDS_SAMPLE:
        return 0
    if name.startswith("faiss-"):
        from .faiss_codes import smallest_sample as faiss_smallest

        return faiss_smallest(name[len("faiss-") :])
    from .linear import ITQ_SMALLEST_SAMPLE

    return ITQ_SMALLEST_SAMPLE


def train_codec(
    name: str,
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    *,
    sample: npt.ArrayLike | None = None,
    seed: int = 0,
    sample_seed: int | None = None,
    unit: bool = False,
    **faiss_options: int,
) -> Codec:
    """The code ``name`` (one of `CODES`) of at most ``budget`` bytes a vector for this mean and covariance;
    ``sample`` for `NEEDS_SAMPLE`, ``seed`` for random parts, ``faiss_options`` to `train_faiss`. ``unit``:
    unit-length vectors (the tool's outputs). A budget that fits no code is a `BadInputError`."""
    if name not in CODES:
        raise BadInputError(f"unknown code {name!r}: one of {', '.join(CODES)}")
    if isinstance(budget, bool) or int(budget) != budget:
        raise BadInputError(f"a byte budget is a whole number, got {budget!r}")
    if name in NEEDS_SAMPLE and sample is None:
        raise BadInputError(f"the {name} code learns from a sample of the vectors: give one")
    if name.startswith("eigen"):
        from .linear import train_eigen

        queries = "isotropic" if name == "eigen-iso" else "data"
        return train_eigen(
            mean, covariance, int(budget), correction=name == "eigen+f", queries=queries, seed=seed
        ).with_unit(unit)
    if name.startswith("bits-"):
        from .linear import train_sign_bits

        rotation = name[len("bits-") :].removesuffix("+f")
        return train_sign_bits(
            mean, covariance, int(budget), rotation=rotation, sample=sample, seed=seed, correction=name.endswith("+f")
        ).with_unit(unit)
    from .faiss_codes import FaissTraining, train_faiss

    assert sample is not None  # checked above
    training = FaissTraining(seed=seed, sample_seed=sample_seed, **faiss_options)
    return train_faiss(name[len("faiss-") :], mean, covariance, int(budget), sample, training, unit)


def check_budget(name: str, n_features: int, budget: int) -> None:
    """Refuse, as training would, a budget a code of `NEEDS_SAMPLE` cannot take, before its sample is read."""
    if name.startswith("faiss-"):
        from .faiss_codes import layout_for

        layout_for(name[len("faiss-") :], int(n_features), int(budget))
    elif name.startswith("bits-"):
        from .linear import sign_bits

        sign_bits(int(n_features), int(budget), name.endswith("+f"), name.removesuffix("+f"))


def codec_from_bytes(data: bytes, n_features: int | None = None, where: str | None = None) -> Codec:
    """The codec `Codec.to_bytes` wrote, every field checked; `ModelFileError` naming ``where`` and the
    field for damaged, altered or forged bytes; `BadInputError` for a width other than ``n_features``."""
    prefix = f"{where}: " if where else "the codec's bytes: "
    try:
        family, record, arrays = read_parts(data)
        if family == "linear":
            from .linear import LinearCode

            codec: Codec = LinearCode._from_parts(record, arrays)
        elif family == "faiss":
            from .faiss_codes import FaissCode

            codec = FaissCode._from_parts(record, arrays)
        else:
            raise ModelFileError(f"unknown codec family {family!r} (a newer streamwhiten wrote it?)")
    except ModelFileError as exc:
        raise ModelFileError(f"{prefix}{exc}; not written by streamwhiten as it is, refusing it") from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # a record no check above foresaw
        if isinstance(exc, BadInputError):
            raise
        raise ModelFileError(f"{prefix}a codec record no training writes ({type(exc).__name__}: {exc})") from None
    if n_features is not None and codec.n_features != int(n_features):
        raise BadInputError(
            f"{where + ': ' if where else ''}the {codec.label} codec codes vectors of {codec.n_features} values, "
            f"not {int(n_features)}"
        )
    return codec


def code_name(codec: Codec) -> str:
    """The name of `CODES` that trains ``codec`` (``faiss-pq``, ``eigen-iso``, ``bits-itq+f``)."""
    kind, correction = str(getattr(codec, "kind", "")), bool(getattr(codec, "correction", False))
    if codec.family == "faiss":
        return f"faiss-{kind}"
    if kind == "eigen" and not correction:
        return "eigen-iso" if getattr(codec, "training", {}).get("queries") == "isotropic" else "eigen"
    return kind + ("+f" if correction else "")


def record_codec(record: CodecRecord, n_features: int | None = None) -> Codec:
    """The codec of a model's record (`codec_from_bytes`), within unit-vector bounds
    (`Codec.unit_scale_problem`) and agreeing with the record; else `ModelFileError` naming ``record.origin``."""
    where = record.origin or "the model's codec record"
    codec = codec_from_bytes(record.data, n_features, where=where)
    found = codec.unit_scale_problem()  # a model's codec codes its outputs at unit length
    if found is not None:
        raise ModelFileError(
            f"{where}: codec field {found[0]!r} {found[1]}; not written by streamwhiten as it is, refusing it"
        )
    held = (code_name(codec), int(getattr(codec, "budget", codec.bytes_per_vector)), codec.label, codec.n_features)
    said = (record.code, record.budget, record.label, record.n_features)
    if held != said or codec.bytes_per_vector != record.bytes_per_vector:
        raise ModelFileError(
            f"{where}: its record says {said[0]} of {said[1]} bytes ({said[2]}, {said[3]} values, "
            f"{record.bytes_per_vector} bytes a row), but its bytes hold {held[0]} of {held[1]} bytes ({held[2]}, "
            f"{held[3]} values, {codec.bytes_per_vector} bytes a row); not written by streamwhiten as it is, refusing it"
        )
    return codec


#: What a vector-code output's record says of how its rows decode (``apply``, a job's parts).
DECODE_HINT = (
    "serving.decode(rows, attrs) or serving.codec(attrs), attrs the output's attributes: this record holds the "
    "codec (data: its bytes in base64; sha256: their SHA-256)"
)


def codec_record_data(data: bytes) -> dict[str, str]:
    """A vector-code output's ``codec`` entries: the codec's bytes (base64), their SHA-256, how to decode."""
    import base64
    import hashlib

    return {
        "data": base64.b64encode(data).decode("ascii"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "decode": DECODE_HINT,
    }


def codec_from_record(entry: Mapping[str, Any], where: str = "the output") -> Codec:
    """The codec of a vector-code output's ``codec`` entry (``data`` checked against ``sha256``);
    `ModelFileError` naming ``where`` and the field if damaged; `BadInputError` for an entry without data."""
    import base64
    import binascii
    import hashlib

    label, sha = entry.get("label", "vector-code"), str(entry.get("sha256", ""))
    text = entry.get("data")
    if text is None:
        raise BadInputError(
            f"{where}: its {label} codes were written before outputs carried their codec: decode them with "
            f"serving.decode(rows, serving.codec(MODEL)), MODEL the model file whose codec's SHA-256 is {sha}"
        )
    try:
        data = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise ModelFileError(f"{where}: field quantization.codec.data is not base64 (damaged or edited)") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise ModelFileError(f"{where}: field quantization.codec.data does not match its sha256 (damaged or edited)")
    width = entry.get("n_features")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise ModelFileError(
            f"{where}: field quantization.codec.n_features is {width!r}, not a width (damaged or edited)"
        )
    codec = codec_from_bytes(data, None, where=f"{where}: field quantization.codec")
    if width is not None and codec.n_features != width:
        raise ModelFileError(
            f"{where}: field quantization.codec.n_features says {width} values, its codec codes {codec.n_features}"
            " (damaged or edited)"
        )
    return codec


__all__ = [
    "CODES",
    "DECODE_HINT",
    "NEEDS_SAMPLE",
    "TUNE_CODES",
    "Codec",
    "check_budget",
    "code_name",
    "code_size",
    "codec_from_bytes",
    "codec_from_record",
    "codec_record_data",
    "record_codec",
    "smallest_sample",
    "train_codec",
]
