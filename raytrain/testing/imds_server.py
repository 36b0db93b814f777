"""A small instance metadata service speaking IMDSv2 on 127.0.0.1, for tests and benchmarks:
a token from PUT /latest/api/token (401 without one), 404 for the notices until set."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class MetadataServer:
    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.action: dict[str, str] | None = None  # every node's
        self.actions: dict[str, dict[str, str]] = {}  # one node's, by Ray node id
        self.rebalance: dict[str, str] | None = None
        self.polls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _split(self) -> tuple[str | None, str]:
                """A path may name the node first (/NODE/latest/...): one server, many nodes."""
                if self.path.startswith("/latest/"):
                    return None, self.path
                node, _, rest = self.path[1:].partition("/")
                return node, "/" + rest

            def do_PUT(self) -> None:
                if self._split()[1] != "/latest/api/token" or \
                        "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
                    return self._send(400, "")
                token = uuid.uuid4().hex
                server.tokens.add(token)
                self._send(200, token)

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in server.tokens:
                    return self._send(401, "")
                server.polls += 1
                node, path = self._split()
                action = server.actions.get(node, server.action)
                body = {"/latest/meta-data/spot/instance-action": action,
                        "/latest/meta-data/events/recommendations/rebalance":
                            server.rebalance}.get(path)
                self._send(404, "") if body is None else self._send(200, json.dumps(body))

            def _send(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def interrupt(self, action: str = "terminate", time: str = "2026-12-01T12:00:00Z",
                  node: str | None = None) -> None:
        """A notice for every node, or for `node` only (its Ray id, in the path)."""
        if node is None:
            self.action = {"action": action, "time": time}
        else:
            self.actions[node] = {"action": action, "time": time}

    def recommend_rebalance(self, time: str = "2026-12-01T11:55:00Z") -> None:
        self.rebalance = {"noticeTime": time}

    def clear(self) -> None:
        self.action = self.rebalance = None
        self.actions.clear()

    def close(self) -> None:
        self._http.shutdown()
