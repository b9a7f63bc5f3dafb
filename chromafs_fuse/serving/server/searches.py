"""`chromafs search` answered by the mount server, warm: per site (its settings), one SiteViews
kept, so that the model, each reader class's vectors and BM25 index and the site's pages stay in
memory from one query to the next. Runs in the server's worker threads; blocking."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from chromafs_fuse.access import Principal
from chromafs_fuse.config import SessionConfig
from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import SESSION_OPTIONS, request_values
from chromafs_fuse.revocation import Revocation, refusal
from chromafs_fuse.search import hit_line, hit_record
from chromafs_fuse.serving.protocol import Search
from chromafs_fuse.site.loader import verify_reader
from chromafs_fuse.site.views import SiteViews

MAX_SITES = 4  # sites kept warm; the least recently searched one is let go


class Searches:
    def __init__(self, revoked: Callable[[str, Principal], Revocation | None] | None = None) -> None:
        self.revoked = revoked  # the revocation the server keeps for a site's reader, if any
        self._views: OrderedDict[str, SiteViews] = OrderedDict()
        self._lock = threading.Lock()

    def answer(self, request: Search) -> dict[str, Any]:
        """The search's answer fields; a ChromafsError (a bad option, a refused token, a site
        that does not exist, a backend down) as its kind."""
        try:
            values = request_values(request.options, SESSION_OPTIONS)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        config = SessionConfig.from_args(SimpleNamespace(**values))
        principal = verify_reader(request.token, config)  # revoked in the site's Redis: refused there
        revocation = self.revoked(config.site, principal) if self.revoked and principal.authenticated else None
        if revocation is not None:
            raise refusal(revocation)
        view = self._views_of(config).view_for(principal)
        result = view.search_result(request.query, request.limit, request.embedder, request.rank)
        return {
            "records": [hit_record(hit) for hit in result.hits],  # as --json prints them
            "lines": [hit_line(hit) for hit in result.hits],  # as the command prints them
            "mode": result.mode,
            "embedder": result.embedder,
            "notes": result.notes,
        }

    def _views_of(self, config: SessionConfig) -> SiteViews:
        """The site's views, kept by everything that shapes them (not how tokens are verified:
        each request's reader is verified on its own). The tree is checked for a re-ingest on
        every query (a version read), so no thread is left behind by a site let go."""
        settings = dataclasses.asdict(config)
        settings.pop("keys")
        key = json.dumps(settings, sort_keys=True, default=str)
        with self._lock:
            views = self._views.get(key)
            if views is None:
                views = self._views[key] = SiteViews(config, refresh_s=0)
                while len(self._views) > MAX_SITES:
                    self._views.popitem(last=False)
            self._views.move_to_end(key)
            return views
