"""Frontmatter in every format docs tools write, and how its access keys decide a page (no FUSE)."""

from __future__ import annotations

import pytest

from chromafs_fuse.ingest.access_rules import (
    Access,
    AccessSpecError,
    AclRule,
    decide_access,
    decode_config_json,
)
from chromafs_fuse.ingest.frontmatter import ANY_KEY, read_frontmatter

ADMIN = Access(False, ("admin",))
PUBLIC = Access(True)
AUTHENTICATED = Access(False)


def access_of(text: str, rules: tuple[AclRule, ...] = (), key: str = "page.md") -> Access | None:
    return decide_access(key, text, rules, set(), PUBLIC)[0]


@pytest.mark.parametrize(
    "text",
    [
        "---\ngroups: [admin]\n---\nbody\n",
        "---\r\ngroups: [admin]\r\n---\r\nbody\r\n",  # CRLF
        "\ufeff---\ngroups: [admin]\n---\nbody\n",  # BOM
        "--- \ngroups: [admin]\n---  \t\nbody\n",  # spaces after the fences
        "---\ngroups:\n- admin\n...\nbody\n",  # YAML's own end marker, a sequence at the key's column
        '+++\ntitle = "x"\ngroups = ["admin"]\n+++\nbody\n',  # TOML (Hugo)
        '+++\r\ngroups = [ "admin" ]\r\n+++ \r\nbody\r\n',
        '+++\ntitle = "x"\n[params]\ngroups = ["admin"]\n+++\n',  # Hugo's params table
        '{\n  "title": "x",\n  "groups": ["admin"]\n}\nbody\n',  # JSON (Hugo)
        '\ufeff{"groups": "admin"}\nbody\n',
        "---\ngroups: admin\npublic: 'false'\n---\n",  # public as text
        "---\ntitle:\tTabbed\ngroups: [admin]\n---\n",  # a tab after the colon
        "---\ntitle: `code` in a title\ngroups: [admin]\n---\n",  # invalid YAML elsewhere in the block
        "---\ndate: 2019-29-11\ngroups: [admin]\n---\n",  # impossible dates stay text
        "---\ndate: 2019-02-30\nlastmod: 2020-01-01T24:00:00Z\nold: 0000-01-01\ngroups: [admin]\n---\n",
        '+++\ndate = 2019-29-11\ngroups = ["admin"]\n+++\n',  # an impossible TOML date: only that key is lost
    ],
)
def test_admin_page_in_every_format(text: str) -> None:
    assert access_of(text) == ADMIN


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("---\npublic: true\n---\n", PUBLIC),
        ('---\npublic: "TRUE"\n---\n', PUBLIC),
        ("+++\npublic = true\n+++\n", PUBLIC),
        ('{"public": true}\n', PUBLIC),
        ("---\npublic: false\n---\n", AUTHENTICATED),
        ("---\ngroups: []\n---\n", AUTHENTICATED),
        ("---\ntitle: nothing about access\n---\n", PUBLIC),  # the site default
        ("no frontmatter\n", PUBLIC),
        ("{/* an MDX comment */}\n# Page\n", PUBLIC),  # not JSON frontmatter
        ("---\nnever closed, says nothing\n", PUBLIC),  # a thematic break, not a block
    ],
)
def test_access_values(text: str, expected: Access) -> None:
    assert access_of(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "---\ngroups: [admin\n---\nsecret\n",  # broken YAML in the access key
        "---\ntitle: x\n\tgroups: [admin]\n---\n",  # a tab-indented access key
        "---\npublic: maybe\n---\n",
        "---\npublic: 1\n---\n",
        "---\ngroups: [1, 2]\n---\n",
        "---\ngroups: [admin]\nnever closed\n",  # an unclosed block that names access keys
        '+++\ngroups = ["admin"\n+++\n',
        '{"groups": ["admin"],}\n',  # JSON that does not parse
        "---\n- a list, not a mapping\n---\n",
        '+++\ntitle = "x"\n[params]\ngroups = ["admin"\n+++\n',
    ],
)
def test_unreadable_access_fails_closed(text: str) -> None:
    assert access_of(text) is None
    # ...unless an --acl rule says who may read it
    assert access_of(text, (AclRule("*.md", ADMIN),)) == ADMIN


def test_problems_name_the_line() -> None:
    frontmatter = read_frontmatter("---\ntitle: ok\ngroups: [admin\nx: 1\n---\n")
    assert frontmatter is not None and frontmatter.access_unreadable()
    assert frontmatter.issues[0].line in (3, 4, 5)
    toml = read_frontmatter('+++\ntitle = "x"\ndate = 2019-29-11\n+++\n')
    assert toml is not None and toml.unreadable == {"date"} and toml.issues[0].line == 3
    assert toml.fields == {"title": "x"}
    broken_json = read_frontmatter('{\n  "a": 1,\n  "b": \n}\n')
    assert broken_json is not None and broken_json.unreadable == {ANY_KEY} and broken_json.issues[0].line == 4


def test_the_body_line_is_known() -> None:
    assert read_frontmatter("---\na: 1\n---\nbody").body_line == 4  # type: ignore[union-attr]
    assert read_frontmatter('{"a": 1}\nbody').body_line == 2  # type: ignore[union-attr]


def test_yaml_values_that_used_to_raise_stay_text() -> None:
    frontmatter = read_frontmatter("---\ndate: 2019-29-11\nexplicit: !!timestamp 2020-01-01T24:00:00Z\n---\n")
    assert frontmatter is not None and not frontmatter.issues
    assert frontmatter.fields == {"date": "2019-29-11", "explicit": "2020-01-01T24:00:00Z"}


@pytest.mark.parametrize(
    ("data", "warns"),
    [
        (b'{"navigation": {"pages": ["a"]}}', False),
        (b'\xef\xbb\xbf{"navigation": {"pages": ["a"]}}', False),  # BOM
        (b'{"navigation": {"pages": ["a",],},}', True),  # trailing commas
        (b'{"name": "Caf\xe9", "navigation": {"pages": ["a"]}}', True),  # Latin-1
        (b'{\n  // a comment\n  "navigation": {"pages": ["a"]}\n}', True),
    ],
)
def test_navigation_files_as_docs_tools_accept_them(data: bytes, warns: bool) -> None:
    value, warnings = decode_config_json(data, "docs.json")
    assert value["navigation"] == {"pages": ["a"]}
    assert bool(warnings) == warns


def test_unreadable_navigation_file_names_the_line() -> None:
    with pytest.raises(AccessSpecError, match=r"docs.json: line 3"):
        decode_config_json(b'{\n "a": 1\n "b": [\n', "docs.json")
