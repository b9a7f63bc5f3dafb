"""How ingest decides a page's access from the source site (pure, no I/O).

Order, first that speaks wins: the page's frontmatter (`public`, `groups`, in
any format `frontmatter.py` reads; Hugo's `params` table when the top level
has neither), then the --acl glob rules, then a navigation file's groups marked
public (`NAVIGATION_FILES`), then the site default.

Fail closed: a page whose access keys cannot be read gets no access from its
frontmatter; only an --acl rule can then publish it, otherwise it is served to
nobody (`decide_access` returns None).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import json5
import yaml

from chromafs_fuse.errors import UsageError
from chromafs_fuse.ingest.frontmatter import ACCESS_KEYS, Frontmatter, read_frontmatter

MARKDOWN_SUFFIXES = (".md", ".mdx", ".markdown")
# raise when decide_access may decide the same bytes otherwise: every page's frontmatter is then
# read again at the next ingest (access_inputs_digest)
ACCESS_RULES_REVISION = 1


class AccessSpecError(UsageError, ValueError):
    """A frontmatter block or ACL rule that cannot be understood."""


@dataclass(frozen=True, slots=True)
class Access:
    is_public: bool
    groups: tuple[str, ...] = ()

    def as_tree_fields(self) -> dict[str, Any]:
        return {"isPublic": self.is_public, "groups": list(self.groups)}


def default_access(mode: str) -> Access:
    if mode == "public":
        return Access(True)
    if mode == "authenticated":
        return Access(False)
    raise ValueError(f"unknown default access {mode!r} (public, authenticated)")


UNDECODABLE = "\ufffd"


def _groups_value(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [g.strip() for g in value.split(",") if g.strip()]
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise AccessSpecError(f"{where}: 'groups' must be a list of strings")
    for group in value:
        if UNDECODABLE in group:  # a byte that is not UTF-8, read as U+FFFD: no reader holds that group
            raise AccessSpecError(
                f"{where}: 'groups' names \"{group}\", with bytes that are not UTF-8: fix the file's encoding"
            )
    return tuple(sorted(set(value)))  # one form for the tree: a page's access is a set of groups


def access_from_fields(fields: Mapping[str, Any], where: str) -> Access | None:
    """Access from `public`/`groups` fields, or None if neither is present."""
    has_public = "public" in fields
    has_groups = "groups" in fields and fields["groups"] is not None
    if not has_public and not has_groups:
        return None
    public = fields.get("public", False)
    if isinstance(public, str) and public.strip().lower() in ("true", "false"):
        public = public.strip().lower() == "true"
    if not isinstance(public, bool):
        raise AccessSpecError(f"{where}: 'public' must be true or false, not \"{public}\"")
    groups = _groups_value(fields["groups"], where) if has_groups else ()
    if public:
        return Access(True, groups)
    return Access(False, groups)


@dataclass(frozen=True, slots=True)
class AclRule:
    pattern: str
    access: Access


def parse_acl(text: str, source: str) -> list[AclRule]:
    """--acl FILE: a YAML/JSON list of {glob|path, public?, groups?}, first match wins."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AccessSpecError(f"{source} is not valid YAML/JSON") from exc
    if isinstance(data, Mapping) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list):
        raise AccessSpecError(f"{source}: expected a list of rules")
    rules = []
    for number, item in enumerate(data, 1):
        where = f"{source} rule {number}"
        if not isinstance(item, Mapping):
            raise AccessSpecError(f"{where}: not a mapping")
        pattern = item.get("glob", item.get("path"))
        if not isinstance(pattern, str) or not pattern:
            raise AccessSpecError(f"{where}: needs a 'glob'")
        access = access_from_fields(item, where)
        if access is None:
            raise AccessSpecError(f"{where}: needs 'public' or 'groups'")
        rules.append(AclRule(pattern.lstrip("/"), access))
    return rules


def access_inputs_digest(default_mode: str, rules: Iterable[AclRule], navigation_public: set[str]) -> str:
    """What a page's access is decided from beside its own bytes and key: the site default, the
    --acl rules in their order, the groups a navigation file publishes, this module's revision and
    the YAML reader's version. Equal digests and equal bytes decide equal access."""
    inputs = [
        ACCESS_RULES_REVISION,
        yaml.__version__,
        default_mode,
        [[rule.pattern, rule.access.is_public, list(rule.access.groups)] for rule in rules],
        sorted(navigation_public),
    ]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:32]


def match_acl(rules: Iterable[AclRule], key: str) -> Access | None:
    for rule in rules:
        if fnmatch.fnmatchcase(key, rule.pattern) or fnmatch.fnmatchcase(key, rule.pattern.rstrip("/") + "/*"):
            return rule.access
    return None


def frontmatter_access(frontmatter: Frontmatter, where: str) -> Access | None:
    """Access from a page's frontmatter, None if it says nothing; AccessSpecError if
    its access keys are there but cannot be read."""
    if frontmatter.access_unreadable():
        names = sorted(frontmatter.unreadable & set(ACCESS_KEYS)) or ["the block"]
        raise AccessSpecError(f"access keys cannot be read ({', '.join(names)})")
    fields = frontmatter.fields
    params = fields.get("params")
    if "public" not in fields and fields.get("groups") is None and isinstance(params, Mapping):
        return access_from_fields(params, where)  # Hugo's place for a site's own keys
    return access_from_fields(fields, where)


def decide_access(
    key: str,
    text: str | None,
    rules: Iterable[AclRule],
    navigation_public: set[str],
    fallback: Access,
) -> tuple[Access | None, Frontmatter | None, AccessSpecError | None]:
    """(access, frontmatter, why the frontmatter's access could not be read).
    Access None: served to nobody."""
    frontmatter = read_frontmatter(text) if text is not None and key.lower().endswith(MARKDOWN_SUFFIXES) else None
    if frontmatter is not None:
        try:
            access = frontmatter_access(frontmatter, "frontmatter")
        except AccessSpecError as exc:
            return match_acl(rules, key), frontmatter, exc
        if access is not None:
            return access, frontmatter, None
    access = match_acl(rules, key)
    if access is None and navigation_ref(key) in navigation_public:
        access = Access(True)
    return access or fallback, frontmatter, None


# Navigation files read at the site root, in this order: name -> reader of its JSON.
NAVIGATION_FILES = ("docs.json", "mint.json")


def decode_config_json(data: bytes, name: str) -> tuple[Any, list[str]]:
    """A JSON config file as docs tools accept it: UTF-8 with or without a BOM
    (else Latin-1), and JSON5 leniency (trailing commas, comments).
    Returns (value, warnings); raises AccessSpecError naming the line if unreadable."""
    warnings: list[str] = []
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        text = data.decode("latin-1")
        warnings.append(f"not UTF-8 (byte {exc.start}): read as Latin-1")
    try:
        return json.loads(text), warnings
    except json.JSONDecodeError as exc:
        strict_error = exc
    try:
        value = json5.loads(text)
    except ValueError as exc:
        raise AccessSpecError(f"{name}: line {strict_error.lineno}: not valid JSON: {strict_error.msg}") from exc
    warnings.append(f"line {strict_error.lineno}: not strict JSON ({strict_error.msg}); read as JSON5")
    return value, warnings


def public_pages_from_navigation(data: Any) -> set[str]:
    """Page references (no extension, no leading '/') under navigation groups
    marked `"public": true` in a Mintlify docs.json or mint.json (parsed)."""
    if isinstance(data, str | bytes):
        data = json.loads(data)
    found: set[str] = set()

    def walk(node: Any, public: bool) -> None:
        if isinstance(node, Mapping):
            here = public or node.get("public") is True
            for key, value in node.items():
                if key in (
                    "pages",
                    "groups",
                    "navigation",
                    "tabs",
                    "anchors",
                    "dropdowns",
                    "versions",
                    "languages",
                    "products",
                    "menu",
                    "items",
                ):
                    walk(value, here)
                elif key == "page" and isinstance(value, str) and here:
                    found.add(value.strip("/"))
        elif isinstance(node, list):
            for item in node:
                if isinstance(item, str):
                    if public:
                        found.add(item.strip("/"))
                else:
                    walk(item, public)

    walk(data.get("navigation", data) if isinstance(data, Mapping) else data, False)
    return found


def navigation_ref(key: str) -> str | None:
    """The docs.json reference of a page file (its path without the extension)."""
    root, ext = posixpath.splitext(key)
    return root if ext.lower() in MARKDOWN_SUFFIXES else None
