"""How ingest decides a page's access from the source site (pure, no I/O).

Order, first that speaks wins: the page's frontmatter (`public`, `groups`),
then the --acl glob rules, then a `docs.json`/`mint.json` navigation group
marked `"public": true`, then the site default.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

MARKDOWN_SUFFIXES = (".md", ".mdx", ".markdown")


class AccessSpecError(ValueError):
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


def parse_frontmatter(text: str) -> Mapping[str, Any] | None:
    """The YAML frontmatter of a Markdown page, or None when it has none."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if not lines or lines[0].rstrip("\r") != "---":
        return None
    for end in range(1, len(lines)):
        if lines[end].rstrip("\r") in ("---", "..."):
            block = "\n".join(line.rstrip("\r") for line in lines[1:end])
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError as exc:
                raise AccessSpecError(f"frontmatter is not valid YAML: {exc.__class__.__name__}") from exc
            if data is None:
                return {}
            if not isinstance(data, Mapping):
                raise AccessSpecError("frontmatter is not a mapping")
            return data
    return None  # an opening '---' with no close is just text


def _groups_value(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [g.strip() for g in value.split(",") if g.strip()]
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise AccessSpecError(f"{where}: 'groups' must be a list of strings")
    return tuple(value)


def access_from_fields(fields: Mapping[str, Any], where: str) -> Access | None:
    """Access from `public`/`groups` fields, or None if neither is present."""
    has_public = "public" in fields
    has_groups = "groups" in fields and fields["groups"] is not None
    if not has_public and not has_groups:
        return None
    public = fields.get("public", False)
    if not isinstance(public, bool):
        raise AccessSpecError(f"{where}: 'public' must be true or false")
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


def match_acl(rules: Iterable[AclRule], key: str) -> Access | None:
    for rule in rules:
        if fnmatch.fnmatchcase(key, rule.pattern) or fnmatch.fnmatchcase(key, rule.pattern.rstrip("/") + "/*"):
            return rule.access
    return None


def public_pages_from_navigation(docs_json_text: str) -> set[str]:
    """Page references (no extension, no leading '/') under navigation groups
    marked `"public": true` in a Mintlify docs.json or mint.json."""
    try:
        data = json.loads(docs_json_text)
    except json.JSONDecodeError as exc:
        raise AccessSpecError(f"docs.json is not valid JSON: {exc}") from exc
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
