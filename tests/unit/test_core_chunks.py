"""Chunking and reassembly: byte-exact round trips, and corruption detected."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chromafs_fuse.chunks import CorruptPage, Expected, reassemble, split_page

TEXT = st.lists(
    st.sampled_from(["a", "b", " ", "#", "\n", "\r", "\t", "`", "é", "日", "\n\n", "# H\n", "```\n", "word " * 30])
).map("".join)


@given(TEXT, st.integers(min_value=1, max_value=400))
def test_property_newline_join_gives_back_the_page(text: str, max_chars: int) -> None:
    chunks = split_page(text, max_chars)
    assert "\n".join(chunks) == text
    assert reassemble(list(enumerate(chunks))) == text.encode()
    for chunk in chunks:
        assert len(chunk) <= max_chars or "\n" not in chunk  # only a single long line may exceed the bound


def test_long_line_stays_whole() -> None:
    text = "short\n" + "x" * 5000 + "\nend"
    chunks = split_page(text, 100)
    assert "x" * 5000 in chunks


def test_order_does_not_matter_and_checks_pass() -> None:
    data = "alpha\nbeta\ngamma"
    pairs = [(2, "gamma"), (0, "alpha"), (1, "beta")]
    expected = Expected(len(data), hashlib.sha256(data.encode()).hexdigest())
    assert reassemble(pairs, expected=expected) == data.encode()
    assert reassemble([(0, "a"), (1.0, "b")], joiner="") == b"ab"


@pytest.mark.parametrize(
    ("pairs", "reason"),
    [
        ([], "no chunks"),
        ([(0, "a"), (2, "c")], "gaps"),
        ([(1, "b")], "gaps"),
        ([(0, "a"), (0, "b")], "duplicate"),
        ([(-1, "a"), (0, "b")], "negative"),
        ([("0", "a")], "not an integer"),
        ([(0.5, "a")], "not an integer"),
        ([(True, "a")], "not an integer"),
        ([(None, "a")], "not an integer"),
        ([(0, None)], "no text"),
    ],
)
def test_corrupt_chunks_are_refused(pairs: list[tuple[object, object]], reason: str) -> None:
    with pytest.raises(CorruptPage, match=reason):
        reassemble(pairs)


def test_size_or_checksum_mismatch_is_refused() -> None:
    with pytest.raises(CorruptPage, match="bytes"):
        reassemble([(0, "abc")], expected=Expected(size=4))
    with pytest.raises(CorruptPage, match="sha256"):
        reassemble([(0, "abc")], expected=Expected(sha256="0" * 64))


@pytest.mark.parametrize("count", [11, 12, 25, 101])
def test_many_chunks_out_of_order_in_string_order(count: int) -> None:
    """String order of the indexes (0, 1, 10, 11, 2, ...) is not chunk order."""
    parts = [f"part {i}" for i in range(count)]
    pairs = sorted(((i, p) for i, p in enumerate(parts)), key=lambda pair: str(pair[0]))
    assert [i for i, _ in pairs][:3] == [0, 1, 10]
    data = "\n".join(parts).encode()
    expected = Expected(len(data), hashlib.sha256(data).hexdigest())
    assert reassemble(pairs, expected=expected) == data
    assert reassemble(list(reversed(pairs)), expected=expected) == data
