"""Address grammar: round trip, injectivity, and one named error per kind of bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ie_core import Address, format_address, parse_address, to_address
from ie_core.errors import (
    AddressError,
    EmptyNameError,
    InvalidNameError,
    LayerOnTrunkPointError,
    LegacySyntaxError,
    MissingLayerError,
    NegativeLayerError,
    UnknownCoordinateError,
    UnknownPointError,
)

names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
coords = st.none() | st.integers(min_value=0, max_value=10_000)
addresses = st.builds(Address, names, coords, coords)


@given(addresses)
def test_format_then_parse_is_identity(address: Address) -> None:
    assert parse_address(format_address(address)) == address


@given(addresses, addresses)
def test_formatting_is_injective(a: Address, b: Address) -> None:
    assert (format_address(a) == format_address(b)) == (a == b)


@given(st.text(max_size=30))
def test_parse_never_raises_anything_but_address_errors(text: str) -> None:
    try:
        address = parse_address(text)
    except AddressError as exc:
        assert exc.text is not None
    else:
        assert format_address(address) == text


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", EmptyNameError),
        (".3", EmptyNameError),
        ("resid_post.-1", NegativeLayerError),
        ("resid_post.3.bogus", UnknownCoordinateError),
        ("resid_post.03", UnknownCoordinateError),
        ("resid_post.3.stream-1.stream-2", UnknownCoordinateError),
        ("resid_post.3.4", UnknownCoordinateError),
        ("resid_post:3", LegacySyntaxError),
        ("Resid_post.3", InvalidNameError),
        ("3resid", InvalidNameError),
        ("path.", EmptyNameError),
    ],
)
def test_bad_syntax_raises_its_own_error_with_the_text(
    text: str, error: type[AddressError]
) -> None:
    with pytest.raises(error) as info:
        parse_address(text)
    assert info.value.text == text
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("embeddings.3", LayerOnTrunkPointError),
        ("resid_post", MissingLayerError),
        ("resid_psot.3", UnknownPointError),
        (("resid_post", -2), NegativeLayerError),
    ],
)
def test_registry_checks(value: object, error: type[AddressError]) -> None:
    with pytest.raises(error):
        to_address(value, check=True)  # type: ignore[arg-type]


def test_every_form_names_the_same_address() -> None:
    want = Address("resid_post", 10)
    assert to_address("resid_post.10") == want
    assert to_address(("resid_post", 10)) == want
    assert to_address(want) is want
    assert to_address("resid_post.5.stream-2") == Address("resid_post", 5, 2)
    assert str(want) == "resid_post.10"


def test_path_addresses() -> None:
    address = parse_address("path.model.layers.0.mlp")
    assert address.is_path and address.module_path == "model.layers.0.mlp"
    assert to_address("path.model.norm", check=True).module_path == "model.norm"
    with pytest.raises(UnknownCoordinateError):
        Address("path.model.norm", 3)


# Unicode has many digits that `str.isdigit` and `\d` accept; only ASCII 0-9 are layer numbers.
NON_ASCII_DIGITS = ["²", "①", "١", "１", "٣", "߁", "𝟙", "Ⅻ"]


@pytest.mark.parametrize("digit", NON_ASCII_DIGITS)
def test_non_ascii_digits_are_address_errors_not_layers(digit: str) -> None:
    for text in (
        f"resid_post.{digit}",
        f"resid_post.1{digit}",
        f"resid_post.{digit}.stream-1",
        f"resid_post.1.stream-{digit}",
        f"resid_post.-{digit}",
    ):
        with pytest.raises(AddressError) as info:
            parse_address(text)
        assert info.value.text == text
        assert "leading zeros" not in str(info.value), text


def test_stream_numbers_with_leading_zeros_are_refused() -> None:
    # "stream-01" and "stream-1" would otherwise name one address (formatting not injective).
    with pytest.raises(UnknownCoordinateError, match="leading zeros"):
        parse_address("resid_post.1.stream-01")


_DIGITISH = st.characters(categories=("Nd", "Nl", "No")) | st.sampled_from("0123456789-")


@settings(max_examples=500, deadline=None)
@given(
    names,
    st.lists(st.text(_DIGITISH, min_size=1, max_size=4), min_size=1, max_size=2),
    st.booleans(),
)
def test_digit_like_coordinates_parse_exactly_or_raise_address_errors(
    name: str, parts: list[str], as_stream: bool
) -> None:
    coords = [
        f"stream-{p}" if as_stream and i == len(parts) - 1 else p for i, p in enumerate(parts)
    ]
    text = ".".join([name, *coords])
    try:
        address = parse_address(text)
    except AddressError as exc:
        assert exc.text == text
        assert type(exc) is not AddressError  # always a named subclass
    else:
        assert text.isascii(), f"{text!r} parsed although it holds non-ASCII digits"
        assert format_address(address) == text
