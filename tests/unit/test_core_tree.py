"""The pure core: path rules, tree decoding, access filtering, inode table."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chromafs_fuse.access import Principal, may_read, visible_entries
from chromafs_fuse.blob_pieces import PIECE_BYTES
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.pathrules import InvalidPath, normalize_key
from chromafs_fuse.tree import TreeError, _parse_entry, _plain_entry, encode_tree_document, parse_tree


def doc(obj: object) -> str:
    return json.dumps(obj)


@pytest.mark.parametrize(
    "raw",
    ["", "/", "a/", "a//b", "./a", "a/./b", "../a", "a/..", "a\x00b", "a\nb", "a\x7fb", "x" * 256, "a/" * 2048 + "b"],
)
def test_bad_keys_are_rejected(raw: str) -> None:
    with pytest.raises(InvalidPath):
        normalize_key(raw)


@pytest.mark.parametrize(
    ("raw", "key"), [("/a/b.mdx", "a/b.mdx"), ("a/b.mdx", "a/b.mdx"), ("日本語/は.md", "日本語/は.md")]
)
def test_good_keys_are_normalized(raw: str, key: str) -> None:
    assert normalize_key(raw) == key


def test_tree_in_every_encoding_decodes_the_same() -> None:
    tree = {"/auth/oauth.mdx": {"isPublic": True, "groups": []}, "internal/billing.mdx": {"groups": ["admin"]}}
    plain = json.dumps(tree)
    encodings = [
        plain,
        base64.b64encode(plain.encode()).decode(),
        base64.b64encode(gzip.compress(plain.encode())).decode(),
        encode_tree_document(tree),
    ]
    parsed = [parse_tree(e).entries for e in encodings]
    assert all(p == parsed[0] for p in parsed)
    assert set(parsed[0]) == {"auth/oauth.mdx", "internal/billing.mdx"}
    assert parsed[0]["auth/oauth.mdx"].source_key == "/auth/oauth.mdx"
    assert parsed[0]["internal/billing.mdx"].is_public is False
    assert parsed[0]["internal/billing.mdx"].size is None


@pytest.mark.parametrize(
    "document",
    [
        "",
        "not json",
        base64.b64encode(b"\x1f\x8b\x08garbage").decode(),
        "[1, 2]",
        '"text"',
        base64.b64encode(gzip.compress(b"{broken")).decode(),
    ],
)
def test_unusable_tree_is_refused(document: str) -> None:
    with pytest.raises(TreeError):
        parse_tree(document)


def test_bad_entries_are_skipped_not_fatal() -> None:
    tree = {
        "ok.md": {"isPublic": True},
        "a/../b.md": {"isPublic": True},
        "bad-public.md": {"isPublic": "yes"},
        "bad-groups.md": {"groups": "admin"},
        "bad-size.md": {"isPublic": True, "size": -1},
        "bad-sha.md": {"isPublic": True, "sha256": "zz"},
        "not-object.md": [],
        "nan-mtime.md": {"isPublic": True, "mtime": float("nan")},
        "huge-mtime.md": {"isPublic": True, "mtime": 1e300},
        "huge-size.md": {"isPublic": True, "size": 2**63},
        "dir": {"isPublic": True},
        "dir/child.md": {"isPublic": True},
        "/ok.md": {"isPublic": True},
    }
    parsed = parse_tree(doc(tree))
    assert set(parsed.entries) == {"ok.md", "dir/child.md"}
    skipped = {k for k, _ in parsed.skipped}
    assert len(skipped) == len(tree) - 2


def test_access_rule() -> None:
    tree = parse_tree(
        doc(
            {
                "pub.md": {"isPublic": True, "groups": ["admin"]},
                "any-user.md": {"isPublic": False, "groups": []},
                "admin.md": {"groups": ["admin"]},
                "billing.md": {"groups": ["billing"]},
                "both.md": {"groups": ["admin", "billing"]},
            }
        )
    ).entries

    def sees(p: Principal) -> set[str]:
        return set(visible_entries(tree, p))

    assert sees(Principal.anonymous()) == {"pub.md"}
    assert sees(Principal.of([])) == {"pub.md", "any-user.md"}
    assert sees(Principal.of(["billing"])) == {"pub.md", "any-user.md", "billing.md", "both.md"}
    assert sees(Principal.of(["admin", "x"])) == {"pub.md", "any-user.md", "admin.md", "both.md"}


GROUPS = st.sampled_from(["admin", "billing", "eng", "support"])
NAME = st.text(alphabet="abcé日-_. ", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
ENTRY = st.fixed_dictionaries({"isPublic": st.booleans(), "groups": st.lists(GROUPS, max_size=2)})
TREE = st.dictionaries(st.lists(NAME, min_size=1, max_size=4).map("/".join), ENTRY, max_size=25)


@given(TREE, st.one_of(st.none(), st.frozensets(GROUPS)))
def test_property_visible_set_is_exactly_the_rule(
    raw: dict[str, dict[str, object]], groups: frozenset[str] | None
) -> None:
    principal = Principal.anonymous() if groups is None else Principal.of(groups)
    parsed = parse_tree(doc(raw))
    table = InodeTable(visible_entries(parsed.entries, principal))
    reachable: set[str] = set()
    dirs: set[str] = set()

    def walk(inode: int, prefix: str) -> None:
        for name, child in table.children(inode):
            path = prefix + name.decode()
            node = table.get(child)
            assert node is not None and node.inode == child
            assert table.lookup(inode, name) == node
            if node.is_dir:
                dirs.add(path)
                walk(child, path + "/")
            else:
                reachable.add(path)

    walk(ROOT_INODE, "")

    def oracle(written: dict[str, object]) -> bool:
        """The access rule as the docs state it, read from the tree as written (not from PathEntry)."""
        if written.get("isPublic") is True:
            return True
        if groups is None:
            return False
        named = written.get("groups") or []
        return not named or bool(set(named) & groups)  # type: ignore[call-overload]

    expected = {k for k, e in parsed.entries.items() if oracle(raw[e.source_key])}
    assert expected == {k for k, e in parsed.entries.items() if may_read(e, principal)}
    assert reachable == expected
    # every directory holds at least one visible file
    assert all(any(f.startswith(d + "/") for f in reachable) for d in dirs)
    # names outside the visible set are not reachable by lookup
    for key in set(parsed.entries) - expected:
        assert table.resolve(key) is None


def test_inodes_are_stable_and_independent_of_hidden_paths() -> None:
    full = parse_tree(doc({"a/b.md": {"isPublic": True}, "a/secret.md": {"groups": ["x"]}, "c.md": {"isPublic": True}}))
    public = InodeTable(visible_entries(full.entries, Principal.anonymous()))
    everyone = InodeTable(visible_entries(full.entries, Principal.of(["x"])))
    for path in ("a", "a/b.md", "c.md"):
        assert public.resolve(path).inode == everyone.resolve(path).inode  # type: ignore[union-attr]
    assert public.resolve("a/secret.md") is None
    assert public.lookup(ROOT_INODE, b"..") == public.get(ROOT_INODE)


def test_case_only_twins_are_two_files() -> None:
    parsed = parse_tree(doc({"Guide.md": {"isPublic": True}, "guide.md": {"isPublic": True}}))
    table = InodeTable(parsed.entries)
    assert {n.path for n in map(table.node, range(len(table))) if n.entry} == {"Guide.md", "guide.md"}
    assert table.resolve("Guide.md") != table.resolve("guide.md")


FULL_ENTRY = st.fixed_dictionaries(
    {"isPublic": st.booleans(), "groups": st.lists(GROUPS, max_size=2)},
    optional={
        "size": st.integers(0, 10**9),
        "sha256": st.binary(min_size=32, max_size=32).map(bytes.hex),
        "mtime": st.floats(0, 4e9, allow_nan=False),
        "blob": st.fixed_dictionaries({"url": st.just("s3://b/k"), "size": st.integers(0, 10**6)}),
        "chunks": st.integers(1, 10**6),
    },
)


@given(st.dictionaries(st.lists(NAME, min_size=1, max_size=4).map("/".join), FULL_ENTRY, max_size=25))
def test_property_the_table_gives_back_every_entry_exactly_and_in_tree_order(raw: dict[str, dict[str, object]]) -> None:
    parsed = parse_tree(doc(raw))
    table = InodeTable(parsed.entries)
    for key, entry in parsed.entries.items():
        node = table.resolve(key)
        assert node is not None and node.entry == entry and node.path == key
        assert table.get(node.inode) == node
    assert table.file_count == len(parsed.entries)
    assert table.total_bytes == sum(e.size or 0 for e in parsed.entries.values())

    def depth_first(prefix: str) -> list[str]:  # files by name, then each subdirectory by name
        names = {k[len(prefix) :].split("/")[0] for k in parsed.entries if k.startswith(prefix)}
        ordered = sorted(names, key=lambda n: n.encode())
        files = [prefix + n for n in ordered if prefix + n in parsed.entries]
        return files + [f for n in ordered if prefix + n not in parsed.entries for f in depth_first(prefix + n + "/")]

    assert [table.node(i).path for i in table.file_order] == depth_first("")


def test_a_binary_file_kept_in_chroma_points_at_its_pieces() -> None:
    one, two = "a" * 64, "b" * 64
    big = PIECE_BYTES + 1
    tree = {
        "small.png": {"blob": {"url": f"chroma:{one}", "size": 10, "sha256": one}},
        "big.bin": {"blob": {"url": f"chroma:{two}", "size": big, "sha256": two, "pieces": [one, two.upper()]}},
        "no-sha.png": {"blob": {"url": f"chroma:{one}", "size": 10}},
        "bad-url.png": {"blob": {"url": f"chroma:{one[:-1]}", "size": 10}},
        "other-sha.png": {"blob": {"url": f"chroma:{one}", "size": 10, "sha256": two}},
        "no-pieces.bin": {"blob": {"url": f"chroma:{two}", "size": big, "sha256": two}},
        "short-pieces.bin": {"blob": {"url": f"chroma:{two}", "size": big, "pieces": [one]}},
        "bad-pieces.bin": {"blob": {"url": f"chroma:{two}", "size": big, "pieces": [one, 7]}},
    }
    parsed = parse_tree(encode_tree_document(tree))
    assert sorted(parsed.entries) == ["big.bin", "no-sha.png", "small.png"]
    big_blob = parsed.entries["big.bin"].blob
    assert big_blob is not None and big_blob.pieces == (one, two) and parsed.entries["big.bin"].size == big
    assert parsed.entries["no-sha.png"].sha256 == one  # the URL names it
    reasons = dict(parsed.skipped)
    assert reasons["'bad-url.png'"] == "'blob.url' is not chroma:<64 lower-case hex digits>"
    assert reasons["'other-sha.png'"] == "'blob.sha256' is not the sha256 its chroma: URL names"
    for key in ("no-pieces.bin", "short-pieces.bin"):
        assert reasons[repr(key)] == "'blob.pieces' does not list the sha256 of each of its 2 pieces"
    assert reasons["'bad-pieces.bin'"] == "'blob.pieces' holds something that is not a 64-digit hex string"


_ODD_KEY_PARTS = [".hidden", ".", "..", "", "x" * 300, "caf\u00e9", "t\tab", "\x7f"]
_KEY_PARTS = st.one_of(st.sampled_from(["a", "docs", "b.md"]), st.sampled_from(_ODD_KEY_PARTS))
_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**54),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from(["A" * 64, "g" * 64, "0" * 63, "1e400"]),
    st.lists(st.sampled_from(["staff", 3, None]), max_size=2),
    st.just({"url": "s3://b/k", "size": 3}),
)
_PLAIN_FIELDS = {
    "isPublic": st.booleans(),
    "groups": st.lists(st.sampled_from(["staff", "admin"]), max_size=2),
    "size": st.integers(0, 10**6),
    "sha256": st.sampled_from(["a" * 64, "0123456789abcdef" * 4]),
    "mtime": st.one_of(st.floats(-1e9, 1e9), st.integers(-(10**9), 10**9)),
    "chunks": st.one_of(st.integers(-1, 5), st.booleans()),
}


@st.composite
def _entries(draw: st.DrawFn) -> dict:
    """Mostly plain entries, each field at times missing or odd."""
    raw = {}
    for name, plain in _PLAIN_FIELDS.items():
        choice = draw(st.integers(0, 19))
        if choice < 16:
            raw[name] = draw(plain)
        elif choice < 19:
            raw[name] = draw(_ODD)
    if draw(st.integers(0, 9)) == 0:
        raw["blob"] = draw(_ODD)
    return raw


@settings(deadline=None, max_examples=1000)  # no deadline: a loaded CI machine is not a failure
@given(st.lists(_KEY_PARTS, min_size=1, max_size=4).map("/".join), st.booleans(), _entries(), st.booleans())
def test_property_the_plain_entry_shortcut_agrees_with_the_full_check(
    key: str, leading_slash: bool, raw: dict, seen_groups: bool
) -> None:
    """Every entry the shortcut takes is the entry the full check makes of it; anything the full
    check refuses, the shortcut leaves to it."""
    source_key = "/" + key if leading_slash else key
    groups: dict[tuple[str, ...], frozenset[str]] = {}
    if seen_groups and isinstance(raw.get("groups"), list):
        with contextlib.suppress(InvalidPath):
            _parse_entry("seen.md", {"groups": raw["groups"]}, groups)
    shortcut = _plain_entry(source_key, raw, dict(groups))
    try:
        full = _parse_entry(source_key, raw, dict(groups))
    except InvalidPath:
        assert shortcut is None
        return
    assert shortcut is None or shortcut == full


_PLAIN = {"isPublic": True, "groups": ["staff"], "size": 3, "sha256": "a" * 64, "mtime": 1.5, "chunks": 2}
_ODD_FIELD_VALUES = [None, True, False, 0, -1, 2**53, 3.5, float("nan"), float("inf"), 2.0**41, -(2.0**41)]
_ODD_FIELD_VALUES += [
    "",
    "A" * 64,
    "a" * 63,
    "g" * 64,
    [],
    ["staff", 3],
    [None],
    "staff",
    {"url": "s3://b/k", "size": 3},
]


@pytest.mark.parametrize("field", [*_PLAIN, "blob"])
@pytest.mark.parametrize("value", _ODD_FIELD_VALUES, ids=repr)
def test_the_plain_entry_shortcut_with_one_odd_field(field: str, value: object) -> None:
    """A plain entry with one field odd, under plain and odd keys: the shortcut takes it only as
    the full check does."""
    for key in ["docs/a.md", "/docs/a.md", "docs/.a.md", "caf\u00e9.md", "docs//a.md", "x" * 256]:
        raw = {**_PLAIN, field: value}
        seen = {("staff",): frozenset({"staff"})}
        shortcut = _plain_entry(key, raw, dict(seen))
        try:
            full = _parse_entry(key, raw, dict(seen))
        except InvalidPath:
            assert shortcut is None, (key, raw)
            continue
        assert shortcut is None or shortcut == full, (key, raw)
    assert _plain_entry("docs/a.md", _PLAIN, {("staff",): frozenset({"staff"})}) is not None  # it is taken at all


@pytest.mark.parametrize(
    ("odd_key", "odd_sha"),
    [
        *[(key, "a" * 64) for key in ("docs/x\nb.md", "docs/.x.md", "caf\u00e9.md", "/lead.md", "x" * 300)],
        *[("docs/z.md", sha) for sha in ("A" * 64, "g" * 64, None)],
    ],
)
def test_a_tree_checked_in_one_scan_gives_what_each_entry_checked_alone_gives(odd_key: str, odd_sha: object) -> None:
    """parse_tree checks a tree's keys and sha256s in one scan when they are all plain: one odd key
    or sha256 among them (a newline inside a key included) is still checked as the full check does."""
    raw = {f"docs/p{n}.md": {**_PLAIN, "sha256": f"{n:064x}"} for n in range(50)}
    raw[odd_key] = {**_PLAIN, "sha256": odd_sha}
    expected = {}
    for key, fields in raw.items():
        with contextlib.suppress(InvalidPath):
            entry = _parse_entry(key, fields, {})
            expected[entry.key] = entry
    parsed = parse_tree(json.dumps(raw)).entries
    assert parsed == expected
    assert ("docs/x\nb.md" in parsed) is False
