"""`chromafs mcp`: the reader's view of a site as read-only MCP tools (the official `mcp` SDK).

Tools: `list`, `read` (with line ranges), `find` (glob), `grep` (`chromafs grep`'s two-stage
grep: -i, -F, -l, context lines) and `search` (semantic). Their answers are what `ls -p`,
`sed -n`/`cat`, `find -name`, `grep -rn` and `chromafs search` give on a mount with the same
token, paths relative to the site's root.

Over stdio the token is the one given at start. Over streamable HTTP each request carries its
own (`Authorization: Bearer JWT`; none: an anonymous reader), verified on every call; readers
with equal visibility share one pruned table. Every call of an expired token fails.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from chromafs_fuse.access import Principal
from chromafs_fuse.config import SessionConfig
from chromafs_fuse.errors import ChromafsError
from chromafs_fuse.grep import GrepQuery
from chromafs_fuse.search import hit_line
from chromafs_fuse.site.loader import verify_reader
from chromafs_fuse.site.view import ReaderView, ViewError
from chromafs_fuse.site.views import SiteViews
from chromafs_fuse.tokens import TokenError

log = logging.getLogger("chromafs.mcp")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
INSTRUCTIONS = (
    "A documentation site as a read-only file tree, showing only the pages your token may read. "
    "Paths are relative to the site's root ('/' or '' is the root). Use list and find to look around, "
    "grep for exact text, search for meaning, read to see a file."
)


SitePath = Annotated[str, Field(description="a file or directory of the site; '/' is the root")]
Lines = Annotated[int, Field(ge=0, le=100)]
Results = Annotated[int, Field(ge=1, le=100)]


class Views(SiteViews):
    """The reader's view for a request: its token (the one given at start, or the request's own
    over HTTP) verified, then the site's view for that reader (site/views.py)."""

    def __init__(self, config: SessionConfig, token: str | None, per_request: bool, refresh_s: float = 5.0) -> None:
        super().__init__(config, refresh_s)
        self.per_request = per_request
        self._fixed = None if per_request else verify_reader(token, config)

    def principal(self, ctx: Context | None) -> Principal:
        if self._fixed is not None:
            return self._fixed
        request = ctx.request_context.request if ctx is not None else None
        header = request.headers.get("authorization", "") if request is not None else ""
        scheme, _, token = header.partition(" ")
        if header and scheme.lower() != "bearer":
            raise ToolError("the Authorization header must be 'Bearer <token>'")
        return verify_reader(token.strip() or None, self.config)

    def view(self, ctx: Context | None) -> ReaderView:
        try:
            principal = self.principal(ctx)
        except TokenError as exc:
            raise ToolError(f"token refused: {exc}") from None
        return self.view_for(principal)


def build_server(views: Views, embedder: str | None = None) -> MCPServer:
    server = MCPServer(name="chromafs", instructions=INSTRUCTIONS)

    def answer(ctx: Context, work: Any) -> str:
        try:
            return work(views.view(ctx))
        except ChromafsError as exc:  # a view's refusal, a backend down, a corrupt page: its message
            raise ToolError(exc.message) from None

    @server.tool(name="list", annotations=READ_ONLY, description="A directory's entries, as `ls -p` (dirs end in /).")
    def list_directory(ctx: Context, path: SitePath = "/") -> str:
        return answer(ctx, lambda view: "\n".join(view.list(path)))

    @server.tool(
        name="read",
        annotations=READ_ONLY,
        description="A text file's content; with start_line/end_line (1-based, inclusive) only those lines.",
    )
    def read_file(ctx: Context, path: SitePath, start_line: int | None = None, end_line: int | None = None) -> str:
        def work(view: ReaderView) -> str:
            data = view.read(path)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ViewError(f"{path}: a binary file of {len(data)} bytes") from None
            if start_line is None and end_line is None:
                return text
            lines = text.splitlines(keepends=True)
            first = max(start_line or 1, 1)
            return "".join(lines[first - 1 : end_line if end_line is not None else len(lines)])

        return answer(ctx, work)

    @server.tool(
        name="find",
        annotations=READ_ONLY,
        description="Paths under `path` whose name matches the glob `name`, as `find PATH -name NAME [-type f|d]`.",
    )
    def find(ctx: Context, name: str = "*", path: SitePath = "/", type: str | None = None) -> str:
        return answer(ctx, lambda view: "\n".join(view.find(name, path, type)))

    @server.tool(
        name="grep",
        annotations=READ_ONLY,
        description=(
            "Lines matching a regular expression in the files under `path`, as `grep -rn` prints them "
            "(path:line:text; context lines path-line-text, groups split by --)."
        ),
    )
    def grep(
        ctx: Context,
        pattern: str,
        path: SitePath = "/",
        ignore_case: bool = False,
        fixed_strings: bool = False,
        files_with_matches: bool = False,
        context: Lines = 0,
    ) -> str:
        def work(view: ReaderView) -> str:
            query = GrepQuery(pattern, fixed_strings, ignore_case)
            try:
                query.compiled()
            except (re.error, UnicodeError) as exc:
                raise ViewError(f"bad pattern: {exc}") from None
            errors: list[str] = []
            lines = [
                line.decode("utf-8", "replace") for line in view.grep(query, path, files_with_matches, context, errors)
            ]
            return "\n".join(lines + [f"grep: {error}" for error in errors])

        return answer(ctx, work)

    @server.tool(
        name="search",
        annotations=READ_ONLY,
        description="Pages nearest in meaning to the query, best first (path:first-last: the best passage).",
    )
    def search(ctx: Context, query: str, n: Results = 10) -> str:
        def work(view: ReaderView) -> str:
            result = view.search_result(query, n, embedder)
            return "\n".join([*(hit_line(hit) for hit in result.hits), *(f"note: {note}" for note in result.notes)])

        return answer(ctx, work)

    return server
