"""The storage value (streamwhiten.storage): every spelling parses and prints back as given, bad ones are one
line naming the value, the settings are checked, and the option objects hold the parsed value."""

from __future__ import annotations

import pytest

from streamwhiten import ApplyOptions
from streamwhiten.errors import BadInputError
from streamwhiten.storage import CODE, CODES, Storage, parse_storage

PLAIN = ("float32", "float16", "int8", "binary")


@pytest.mark.parametrize("spelling", PLAIN + tuple(f"{name}:{budget}" for name in CODES for budget in (1, 24)))
def test_every_spelling_parses_and_prints_back(spelling):
    storage = parse_storage(spelling)
    assert str(storage) == spelling
    assert parse_storage(str(storage)) == storage
    assert parse_storage(storage) is storage  # a parsed value is taken as it is
    name, _, budget = spelling.partition(":")
    if budget:
        assert (storage.dtype, storage.code, storage.budget) == (CODE, name, int(budget))
        assert storage.coded and storage.codec is None
    else:
        assert (storage.dtype, storage.code, storage.budget) == (name, None, None)
        assert storage.coded == (name in ("int8", "binary"))


def test_the_settings_travel_with_the_value_and_are_checked():
    storage = parse_storage("binary", rescore=100, rescore_dtype="int8", int8_clip=3.0)
    assert (str(storage), storage.rescore, storage.rescore_dtype, storage.int8_clip) == ("binary", 100, "int8", 3.0)
    assert storage.label == "binary+rescore100(int8)" and storage.bytes_per_vector(64) == 8 + 64
    assert parse_storage(str(storage), rescore=100, rescore_dtype="int8", int8_clip=3.0) == storage
    assert parse_storage("eigen:24", rescore=50).rescore == 50
    with pytest.raises(BadInputError, match="rescore re-ranks a bit search: it needs dtype 'binary', not 'int8'"):
        parse_storage("int8", rescore=10)
    with pytest.raises(BadInputError, match="rescore_dtype must be"):
        parse_storage("binary", rescore=10, rescore_dtype="float16")
    with pytest.raises(BadInputError, match="int8_clip must be"):
        parse_storage("int8", int8_clip=0.0)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("int9", "dtype must be"),
        ("", "dtype must be"),
        (5, "dtype must be"),
        ("Float32", "dtype must be"),
        ("eigen:0", "a code is NAME:BYTES"),
        ("eigen:", "a code is NAME:BYTES"),
        ("eigen:x", "a code is NAME:BYTES"),
        ("eigen:24:1", "a code is NAME:BYTES"),
        ("eigen:²", "a code is NAME:BYTES"),
        ("nope:4", "a code is NAME:BYTES"),
        (":4", "a code is NAME:BYTES"),
    ],
)
def test_a_bad_spelling_is_one_line_naming_it(bad, words):
    with pytest.raises(BadInputError) as info:
        parse_storage(bad)
    message = str(info.value)
    assert message.startswith(words) and message.endswith(f"got {bad!r}") and "\n" not in message
    if words.startswith("a code"):
        assert all(name in message for name in CODES)  # the names a code takes


def test_a_plain_storage_takes_no_code_and_a_code_takes_a_known_name():
    with pytest.raises(BadInputError, match="a code and budget name a storage of dtype 'code', not 'int8'"):
        Storage("int8", code="eigen", budget=4)
    with pytest.raises(BadInputError, match="got 'nope:4'"):
        Storage(CODE, code="nope", budget=4)
    with pytest.raises(BadInputError, match="known once it is trained"):
        parse_storage("eigen:4").bytes_per_vector(16)


def test_a_recorded_storage_round_trips_through_its_record():
    storage = parse_storage("binary", rescore=20, int8_clip=2.5)
    assert Storage.from_dict(storage.to_dict()) == storage
    assert storage.names(parse_storage("binary")) and not storage.names(parse_storage("int8"))
    assert not parse_storage("eigen:4").names(parse_storage("eigen:5")) and not storage.names(None)


def test_apply_options_hold_the_parsed_value_and_refuse_a_bad_one_when_made():
    options = ApplyOptions(dtype="eigen:24")
    assert isinstance(options.dtype, Storage) and str(options.dtype) == "eigen:24" and options.normalize
    assert ApplyOptions(dtype=options.dtype) == options
    assert ApplyOptions(dtype=None).storing(None).dtype == Storage()
    assert ApplyOptions(dtype=None).storing(parse_storage("int8")).normalize
    with pytest.raises(BadInputError, match=r"^a code is NAME:BYTES.*got 'nope:3'$"):
        ApplyOptions(dtype="nope:3")
    with pytest.raises(BadInputError, match=r"^dtype 'binary' cannot hold the NaN rows skip_nonfinite writes"):
        ApplyOptions(dtype="binary", skip_nonfinite=True)


def test_the_label_of_a_named_code_is_its_spelling_until_it_is_trained():
    from streamwhiten.storage import parse_storage

    assert parse_storage("eigen:24").label == "eigen:24"
    assert parse_storage("bits-itq:8", rescore=100).label == "bits-itq:8+rescore100"
    assert parse_storage("binary", rescore=100, rescore_dtype="int8").label == "binary+rescore100(int8)"
    assert [parse_storage(name).label for name in ("float32", "float16", "int8", "binary")] == [
        "float32",
        "float16",
        "int8",
        "binary",
    ]
