"""A local stand-in for the Hugging Face hub, as much of it as `tern pull` uses.

  GET  /api/models/OWNER/NAME/revision/REV    {"sha": COMMIT, "siblings": [{"rfilename": ...}]}
  HEAD /OWNER/NAME/resolve/REV/PATH           plain files: 200, ETag = git blob id, Content-Length
                                              LFS files (*.safetensors): 302 to /cdn/SHA256 with
                                              X-Linked-Etag (the SHA-256) and X-Linked-Size
  GET  the same                               the body (plain), or the same 302 (LFS)
  GET  /cdn/SHA256                            the blob, with Range (206 + Content-Range) and an ETag; served
                                              by a second server (another port: another host to a client)

REV may be "main" or the commit. Every response from the hub side carries X-Repo-Commit. Errors carry X-Error-Code
as the hub does (RepoNotFound, RevisionNotFound, EntryNotFound). Each request is logged as
(method, path, Range header, Authorization header) in `server.log`.

Faults, set per test on the server object (each keyed by file name):
  drop     first GET of the blob sends half of it, then the connection is closed
  stall    first GET sends half, then waits until `release` is set (a client killed mid-file)
  corrupt  the blob's bytes differ from its advertised SHA-256
  norange  Range is ignored (200 and the whole body)
  huge     X-Linked-Size far beyond any disk (huge_size)
  nohash   no X-Linked-Etag (an LFS file) or ETag (a plain file)
The listing is answered 503 with Retry-After: 1 `busy` times first.
"""
import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, files, commit, token=None, lfs_suffix=".safetensors"):
        self.files = dict(files)          # name -> bytes
        self.commit = commit
        self.token = token                # a private repository: this bearer token only
        self.lfs_suffix = lfs_suffix
        self.extra_names = []             # listed but not served (unsafe names)

    @classmethod
    def from_dir(cls, path, commit, **kw):
        path = Path(path)
        return cls({p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()},
                   commit, **kw)

    def is_lfs(self, name):
        return name.endswith(self.lfs_suffix)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub):
        super().__init__(("127.0.0.1", 0), Handler)
        self.hub = hub
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]


class Hub:
    def __init__(self):
        self.repos = {}
        self.log = []
        self.lock = threading.Lock()
        self.drop, self.stall, self.corrupt, self.norange, self.huge, self.nohash = (set() for _ in range(6))
        self.huge_size = 1 << 60
        self.busy = 0
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.api, self.storage = _Server(self), _Server(self)
        self.url, self.storage_url = self.api.url, self.storage.url

    def add(self, repo_id, repo):
        self.repos[repo_id] = repo
        return repo

    def blob(self, sha):
        for repo in self.repos.values():
            for name, data in repo.files.items():
                if hashlib.sha256(data).hexdigest() == sha:
                    return name, data
        return None, None

    def requests(self, method=None, prefix=""):
        with self.lock:
            return [r for r in self.log if (method is None or r[0] == method) and r[1].startswith(prefix)]

    def stop(self):
        self.release.set()
        for s in (self.api, self.storage):
            s.shutdown()
            s.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    # ---- plumbing -----------------------------------------------------------------------------------------------

    def send(self, code, headers=(), body=b""):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, error_code, message):
        self.send(code, [("X-Error-Code", error_code), ("X-Error-Message", message),
                         ("Content-Type", "application/json")], json.dumps({"error": message}).encode())

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def route(self):
        hub = self.server.hub
        path = unquote(urlsplit(self.path).path)
        with hub.lock:
            hub.log.append((self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self.listing("/".join(parts[2:4]), "/".join(parts[5:]))
        if self.server is hub.storage:
            return self.cdn(parts[1]) if parts[0] == "cdn" and len(parts) == 2 else self.send(404)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
        self.error(404, "NotFound", "no route")

    def repo_for(self, repo_id, rev):
        """The repository, or None after sending the hub's error."""
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found")
            return None
        if repo.token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                self.error(401, "RepoNotFound", "Invalid username or password.")
                return None
            if auth != "Bearer " + repo.token:
                self.error(403, "", "Access to this model is restricted.")
                return None
        if rev not in ("main", repo.commit):
            self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None
        return repo

    # ---- the hub ------------------------------------------------------------------------------------------------

    def listing(self, repo_id, rev):
        hub = self.server.hub
        with hub.lock:
            busy, hub.busy = hub.busy > 0, max(hub.busy - 1, 0)
        if busy:
            return self.send(503, [("Retry-After", "1")])
        repo = self.repo_for(repo_id, rev)
        if repo is None:
            return
        names = list(repo.files) + repo.extra_names
        body = json.dumps({"id": repo_id, "sha": repo.commit, "siblings": [{"rfilename": n} for n in names]})
        self.send(200, [("Content-Type", "application/json")], body.encode())

    def resolve(self, repo_id, rev, name):
        repo = self.repo_for(repo_id, rev)
        if repo is None:
            return
        data = repo.files.get(name)
        if data is None:
            return self.error(404, "EntryNotFound", "Entry not found")
        hub = self.server.hub
        common = [("X-Repo-Commit", repo.commit)]
        if repo.is_lfs(name):
            sha = hashlib.sha256(data).hexdigest()
            size = hub.huge_size if name in hub.huge else len(data)
            tags = [] if name in hub.nohash else [("ETag", '"%s"' % sha), ("X-Linked-Etag", '"%s"' % sha)]
            return self.send(302, common + [("Location", "%s/cdn/%s" % (hub.storage_url, sha)),
                                            ("X-Linked-Size", str(size))] + tags)
        tags = [] if name in hub.nohash else [("ETag", '"%s"' % git_blob_id(data))]
        self.send(200, common + tags, data)

    # ---- the storage (CDN) --------------------------------------------------------------------------------------

    def cdn(self, sha):
        hub = self.server.hub
        name, data = hub.blob(sha)
        if data is None:
            return self.send(404)
        if name in hub.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = self.headers.get("Range")
        if rng and name not in hub.norange:
            spec = rng.split("=", 1)[1]
            start = int(spec.split("-")[0])
            if start >= len(data):
                return self.send(416, [("Content-Range", "bytes */%d" % len(data))])
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("ETag", '"%s"' % sha)
        self.send_header("Accept-Ranges", "bytes")
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        fault = None
        with hub.lock:
            for kind in ("drop", "stall"):
                if name in getattr(hub, kind):
                    getattr(hub, kind).discard(name)
                    fault = kind
        if fault is None:
            self.wfile.write(body)
            return
        half = len(body) // 2
        self.wfile.write(body[:half])
        self.wfile.flush()
        if fault == "stall":
            hub.stalled.set()
            hub.release.wait(60)
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def wait_for(pred, timeout=30, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False
