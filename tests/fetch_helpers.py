"""The loopback server of the fetch tests: hub-style ``/{repo}/resolve/{revision}/{file}`` files (any commit of
``COMMIT`` answers as ``main``), huggingface_hub's tree listing, and plain URLs; on 127.0.0.1 only, stopping
itself after two minutes. Tests change ``server.files``, ``drop_once`` (half a body, then the connection
goes) and ``routes`` (a path -> a callable answering the request: hangs, redirects, stalls)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMIT = "c0ffee" + "0" * 34
BIG = bytes(range(256)) * 4096  # 1 MiB, so a drop mid-file is mid-file


def _zip(member: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(member, data)
    return buffer.getvalue()


FILES = {
    "/org/weights/resolve/main/model.bin": BIG,
    "/org/weights/resolve/main/config.json": b'{"a": 1}',
    "/plain/data.zip": _zip("inner/a.txt", BIG[::-1]),
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "fake-hub"

    def log_message(self, *args):  # quiet
        pass

    def _head(self, send_body: bool) -> None:
        self.server.requested.append(self.path)
        path = self.path.split("?")[0].replace(f"/resolve/{COMMIT}/", "/resolve/main/")  # the branch's one commit
        if path in self.server.routes:
            return self.server.routes[path](self, send_body)
        if path.startswith("/api/models/") and "/tree/" in path:
            return self._tree(path)
        data = self.server.files.get(path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            start = int(ranged[6:].split("-")[0])
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha(data)}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if not send_body:
            return
        body = data[start:]
        if path in self.server.drop_once:  # half the bytes, then the connection goes
            self.server.drop_once.discard(path)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.server.served.append(path)
        self.wfile.write(body)

    def _tree(self, path: str) -> None:
        """huggingface_hub's tree listing: every file of the repo (one page)."""
        repo = path[len("/api/models/") :].split("/tree/")[0]
        prefix = f"/{repo}/resolve/main/"
        entries = [
            {"type": "file", "path": key[len(prefix) :], "size": len(data), "oid": sha(data)[:40]}
            for key, data in self.server.files.items()
            if key.startswith(prefix)
        ]
        body = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        self._head(False)

    def do_GET(self):
        self._head(True)


def serving():
    """The server, running (a generator: a test module's fixture yields from it)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.files, httpd.drop_once, httpd.served, httpd.routes = dict(FILES), set(), [], {}
    httpd.requested = []  # every path asked for, as asked
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    stop = threading.Timer(120, httpd.shutdown)  # bounded: it stops itself whatever the test does
    stop.start()
    yield httpd
    stop.cancel()
    httpd.shutdown()
    httpd.server_close()
