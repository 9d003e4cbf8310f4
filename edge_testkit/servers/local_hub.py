"""A stand-in for the Hugging Face Hub's file endpoint, on 127.0.0.1, for pull tests.

Point huggingface-hub at it with HF_ENDPOINT (read when huggingface_hub is imported, so
set it in the environment of the process that pulls). It answers HEAD and GET on
/{org}/{repo}/resolve/{revision}/{file} with the headers hf_hub_download relies on
(X-Repo-Commit, the file's SHA-256 as ETag, Content-Length) and honours Range requests,
so resumed downloads work. GET /api/models/{org}/{repo}/tree/{revision} lists a repo's
files (huggingface-hub's list_repo_files). `corrupt` serves bytes that do not match the advertised
checksum; `interrupt` cuts the first full GET of a file off halfway, as a dropped
connection would; `rate` (bytes per second) slows every body down, so that a test can act
while a download runs.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class LocalHub:
    def __init__(self, files: dict[tuple[str, str], bytes], *,
                 corrupt: set[tuple[str, str]] | frozenset = frozenset(),
                 interrupt: set[tuple[str, str]] | frozenset = frozenset(),
                 rate: int = 0) -> None:
        self.files = files
        self.rate = rate
        self.corrupt = set(corrupt)
        self.interrupt = set(interrupt)
        self.requests: list[tuple[str, str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:  # keep test output quiet
                pass

            def _lookup(self) -> tuple[bytes, str, tuple[str, str]] | None:
                parts = unquote(self.path.split("?")[0]).lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return None
                key = (f"{parts[0]}/{parts[1]}", "/".join(parts[4:]))
                data = hub.files.get(key)
                if data is None:
                    return None
                sha = hashlib.sha256(data).hexdigest()
                if key in hub.corrupt:
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
                return data, sha, key

            def _answer(self, with_body: bool) -> None:
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                found = self._lookup()
                if found is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data, sha, key = found
                start = 0
                ranged = self.headers.get("Range", "")
                if with_body and ranged.startswith("bytes="):
                    start = int(ranged[6:].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Accept-Ranges", "bytes")
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not with_body:
                    return
                if start == 0 and key in hub.interrupt:
                    hub.interrupt.discard(key)
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # drop the connection mid-body
                    return
                if not hub.rate:
                    self.wfile.write(data[start:])
                    return
                piece = max(hub.rate // 20, 1)  # twenty writes a second
                for at in range(start, len(data), piece):
                    self.wfile.write(data[at:at + piece])
                    time.sleep(0.05)

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def do_GET(self) -> None:
                if self.path.startswith("/api/models/"):
                    self._tree()
                    return
                self._answer(with_body=True)

            def _tree(self) -> None:
                hub.requests.append((self.command, self.path, None))
                parts = unquote(self.path.split("?")[0]).split("/")
                repo = "/".join(parts[3:5])
                listing = [{"type": "file", "path": name, "size": len(data),
                            "oid": hashlib.sha1(data).hexdigest()}
                           for (owner, name), data in hub.files.items() if owner == repo]
                body = json.dumps(listing).encode()
                self.send_response(200 if listing else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
