"""The frontmatter of a Markdown page, in any of the formats docs tools write (pure, no I/O).

- YAML between `---` fences (Mintlify, Docusaurus, MkDocs, Starlight, Jekyll, Hugo);
  a block may also close with `...`.
- TOML between `+++` fences (Hugo's default), read with the standard library's `tomllib`.
- JSON: an object at the very top of the page (Hugo).

A UTF-8 BOM, CRLF line ends and spaces after a fence are accepted. YAML dates
and timestamps stay text, so no value in a valid document can raise.

A block that does not parse is read entry by entry (one top-level key and the
lines under it): what parses is kept, and every key that could not be read is
named in `unreadable`, as is each access word found in text that did not parse.
`ANY_KEY` in `unreadable` means the block's shape itself is unknown, so any key
may be hiding in it. Callers decide what an unreadable key means (ingest fails
closed on access keys).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

ANY_KEY = "*"
ACCESS_KEYS = ("public", "groups")
_ACCESS_WORD = re.compile(r"\b(public|groups)\b")
_FENCES = {"---": "yaml", "+++": "toml"}


@dataclass(frozen=True, slots=True)
class Issue:
    """Something in a frontmatter block that could not be read; `line` counts from 1 in the page."""

    line: int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass(frozen=True, slots=True)
class Frontmatter:
    format: str  # "yaml", "toml" or "json"
    fields: Mapping[str, Any]
    unreadable: frozenset[str] = frozenset()
    issues: tuple[Issue, ...] = ()
    body_line: int = 1  # the page line where the body starts

    def access_unreadable(self) -> bool:
        return bool(self.unreadable & {ANY_KEY, *ACCESS_KEYS})


if TYPE_CHECKING:  # one static base for mypy: both loaders have SafeConstructor's methods
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _TextDatesLoader(_SafeLoader):
    """Safe YAML with timestamps kept as text: `date: 2019-29-11` is a valid document."""


def _timestamp_as_text(loader: _TextDatesLoader, node: yaml.Node) -> str:
    return loader.construct_yaml_str(node)


_TextDatesLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_TextDatesLoader)


def _yaml_error_line(exc: Exception, text: str, first_line: int) -> int | None:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return first_line + mark.line
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML forbids (NUL, say): no mark
        return first_line + text.count("\n", 0, exc.position)
    return None


def _yaml_error_text(exc: Exception) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"not valid YAML: character U+{code:04X} is not allowed"
    problem = getattr(exc, "problem", None)
    if problem:
        return f"not valid YAML: {problem}"
    first = str(exc).strip().splitlines()[:1]
    return f"not valid YAML: {first[0]}" if first else "not valid YAML"


def read_frontmatter(text: str) -> Frontmatter | None:
    """The frontmatter at the top of `text`, or None when the page has none."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if text.startswith("{"):
        return _read_json(text)
    first_end = text.find("\n")
    first = (text if first_end < 0 else text[:first_end]).rstrip(" \t\r")
    kind = _FENCES.get(first)
    if kind is None:
        return None
    lines = text.split("\n")
    closers = ("---", "...") if kind == "yaml" else ("+++",)
    for end in range(1, len(lines)):
        if lines[end].rstrip(" \t\r") in closers:
            block = [line.rstrip("\r") for line in lines[1:end]]
            if kind == "yaml":
                return _read_block(block, "yaml", end + 2, _parse_yaml, _parse_yaml_entry, _yaml_entries)
            return _read_block(block, "toml", end + 2, _parse_toml, _parse_toml, _toml_entries)
    # An opening fence that never closes: plain text, unless it may be hiding access keys.
    if _ACCESS_WORD.search(text):
        return Frontmatter(kind, {}, frozenset({ANY_KEY}), (Issue(1, f"the '{first}' block is never closed"),))
    return None


# --- JSON -------------------------------------------------------------------

_JSON_OBJECT_START = re.compile(r'\{\s*(?:"|\})')


def _read_json(text: str) -> Frontmatter | None:
    """Hugo's JSON frontmatter: one object at the top, the body after it.
    A page that opens with `{` but not `{"` (an MDX expression, say) has none."""
    if not _JSON_OBJECT_START.match(text):
        return None
    try:
        data, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        return Frontmatter("json", {}, frozenset({ANY_KEY}), (Issue(exc.lineno, f"not valid JSON: {exc.msg}"),))
    return Frontmatter("json", data, body_line=text.count("\n", 0, end) + 2)


# --- YAML and TOML blocks -----------------------------------------------------

Entry = tuple[str | None, int, str]  # (key or None if no key could be seen, first line index, text)


def _read_block(
    block: list[str],
    kind: str,
    body_line: int,
    parse: Callable[[str, int], Mapping[str, Any]],
    parse_entry: Callable[[str, int], Mapping[str, Any]],
    entries: Callable[[list[str]], Iterator[Entry]],
) -> Frontmatter:
    first_line = 2  # the block starts on the page's second line
    try:
        return Frontmatter(kind, parse("\n".join(block), first_line), body_line=body_line)
    except _BlockError as whole_error:
        fields: dict[str, Any] = {}
        unreadable: set[str] = set()
        issues = [whole_error.issue]
        for key, index, entry_text in entries(block):
            try:
                fields.update(parse_entry(entry_text, first_line + index))
            except _BlockError as exc:
                unreadable.add(key if key is not None else ANY_KEY)
                unreadable.update(_ACCESS_WORD.findall(entry_text))
                if exc.issue != whole_error.issue:
                    issues.append(exc.issue)
        return Frontmatter(kind, fields, frozenset(unreadable), tuple(issues), body_line=body_line)


class _BlockError(ValueError):
    def __init__(self, issue: Issue) -> None:
        super().__init__(str(issue))
        self.issue = issue


def _parse_yaml(text: str, first_line: int) -> Mapping[str, Any]:
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as exc:
        raise _BlockError(Issue(_yaml_error_line(exc, text, first_line), _yaml_error_text(exc))) from exc
    except (ValueError, TypeError, RecursionError) as exc:  # a constructor that raised on a value
        raise _BlockError(Issue(first_line, f"not valid YAML: {exc}")) from exc
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise _BlockError(Issue(first_line, "frontmatter is not a mapping of keys to values"))
    return data


_YAML_KEY = re.compile(r"""^(?:"([^"]*)"|'([^']*)'|([^\s#\-"'\[\]{}][^:]*?))\s*:(?:[ \t]|$)""")
_YAML_KEY_TAB = re.compile(r"^([^\s:]+):\t+")


def _yaml_entries(block: list[str]) -> Iterator[Entry]:
    """Top-level `key: value` entries with the lines under them (indented,
    blank, comments, or `- item` sequences written at the key's column)."""
    yield from _entries(block, _yaml_key, lambda line: line[:1] in ("", " ", "\t", "#") or line.startswith("- "))


def _yaml_key(line: str) -> str | None:
    match = _YAML_KEY.match(line)
    return next(g for g in match.groups() if g is not None).strip() if match else None


def _parse_yaml_entry(text: str, first_line: int) -> Mapping[str, Any]:
    # YAML 1.2 tools (Hugo's, js-yaml) accept a tab after `key:`; PyYAML does not.
    return _parse_yaml(_YAML_KEY_TAB.sub(r"\1: ", text, count=1), first_line)


def _parse_toml(text: str, first_line: int) -> Mapping[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+)", str(exc))
        line = first_line + int(match.group(1)) - 1 if match else first_line
        message = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
        raise _BlockError(Issue(line, f"not valid TOML: {message}")) from exc


_TOML_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*\s*=""")


def _toml_entries(block: list[str]) -> Iterator[Entry]:
    """Top-level `key = value` entries with their continuation lines; a
    `[table]` header and everything after it form one entry."""
    table_at = next((i for i, line in enumerate(block) if line.lstrip().startswith("[")), len(block))
    yield from _entries(block[:table_at], _toml_key, lambda line: _toml_key(line) is None)
    if table_at < len(block):
        header = block[table_at].strip().strip("[]").strip().split(".")[0].strip("\"'")
        yield header or None, table_at, "\n".join(block[table_at:])


def _toml_key(line: str) -> str | None:
    match = _TOML_KEY.match(line)
    return match.group(1).strip("\"'") if match else None


def _entries(
    block: list[str], key_of: Callable[[str], str | None], continues: Callable[[str], bool]
) -> Iterator[Entry]:
    start = 0
    key: str | None = None
    for index, line in enumerate(block):
        if index == 0 or not continues(line):
            if index > start:
                yield key, start, "\n".join(block[start:index])
            start, key = index, key_of(line)
    if block:
        yield key, start, "\n".join(block[start:])
