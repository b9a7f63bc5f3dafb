"""A reverse proxy on loopback that counts the requests a server answers: `chroma run` logs none,
and a rehearsal needs Chroma's load per session. HTTP/1.1 with keep-alive, one thread per client
connection, one upstream connection per client connection; bodies are forwarded whole. Each
request's kind and the record ids it named are kept too (`take_requests`): what an ingest read
and wrote."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class CountingProxy:
    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or host, parts.port or 80)
        self.counts: Counter[str] = Counter()
        self.requests: list[tuple[str, list[str]]] = []  # (kind, ids named)
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream_conn: http.client.HTTPConnection | None = None

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
                    if self.upstream_conn is None:
                        self.upstream_conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                    try:
                        self.upstream_conn.request(self.command, self.path, body=body, headers=headers)
                        response = self.upstream_conn.getresponse()
                        payload = response.read()
                        break
                    except (OSError, http.client.HTTPException):
                        self.upstream_conn.close()
                        self.upstream_conn = None
                        if attempt == 2:
                            self.send_error(502)
                            return
                proxy.count(self.command, self.path, body if response.status == 200 else None)
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, method: str, path: str, body: bytes | None = None) -> None:
        kind = path.rstrip("/").rsplit("/", 1)[-1] if method == "POST" else method
        named = json.loads(body).get("ids") if body and kind in ("upsert", "add", "get", "delete") else None
        with self._lock:
            self.counts[kind] += 1
            self.requests.append((kind, list(named or [])))

    def take_requests(self) -> list[tuple[str, list[str]]]:
        """Each request since the last call: its kind (upsert, get, ...) and the ids it named."""
        with self._lock:
            requests, self.requests = self.requests, []
        return requests

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
