"""hub_server.py - a small Hugging Face hub on 127.0.0.1 for the tests: the hub's URL layout
(`/api/models/{repo}/revision/{rev}?blobs=true`, `/{repo}/resolve/{rev}/{file}` with LFS files
redirected to `/cdn/{sha256}` as the real hub redirects them to its CDN), its headers (X-Repo-Commit,
ETag, X-Linked-Etag, X-Linked-Size, X-Error-Code), Range requests, a token-protected repo, and
connections dropped mid-file on demand. Every request is logged for the tests to inspect."""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, token=None, gated=False):
        self.commits = {}   # sha -> {name: bytes}
        self.refs = {}      # branch/tag -> sha
        self.token = token  # required Bearer token, or None
        self.gated = gated  # files refused with 403 GatedRepo (the listing stays public, as on the hub)

    def add_commit(self, files, refs=("main",)):
        h = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items()))
                         .encode() + str(len(self.commits)).encode()).hexdigest()
        self.commits[h] = dict(files)
        for r in refs:
            self.refs[r] = h
        return h

    def commit(self, rev):
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


class Hub:
    def __init__(self):
        self.repos = {}
        self.log = []        # (method, path, headers dict)
        self.drops = {}      # file name -> [bytes to send before dropping, times left]
        self.corrupt = set() # file names served with their last byte changed
        self.digests = {}    # (repo, sha, name) -> (git blob id, sha256)
        self.api_body = None # bytes: the API answers this (200) instead of the model description
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        # the "CDN" that LFS files redirect to: another host name for the same server, so that a
        # client must not send the hub token there (absolute, as the real hub's redirects are)
        self.cdn_url = "http://localhost:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------------------------------------
    def send(self, h, code, body=b"", headers=(), head=False):
        h.send_response(code)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def error(self, h, code, err_code, msg, head):
        hdr = [("Content-Type", "application/json"), ("X-Error-Message", msg)]
        if err_code:
            hdr.append(("X-Error-Code", err_code))
        self.send(h, code, json.dumps({"error": msg}).encode(), hdr, head)

    def authorized(self, h, repo, head):
        if repo.token is None:
            return True
        auth = h.headers.get("Authorization")
        if auth == "Bearer " + repo.token:
            return True
        # the hub hides private repos behind 401; the message says to authenticate
        self.error(h, 401, None, "Invalid credentials in Authorization header" if auth else
                   "Access to this repository requires authentication", head)
        return False

    def handle(self, h, head):
        u = urlsplit(h.path)
        path = unquote(u.path)
        with self.lock:
            self.log.append((h.command, h.path, dict(h.headers)))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self.api(h, "/".join(parts[2:4]), "/".join(parts[5:]), head)
        if parts[0] == "cdn" and len(parts) == 2:
            return self.cdn(h, parts[1], head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(h, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        self.error(h, 404, None, "no such endpoint", head)

    def find(self, h, repo_id, rev, head):
        repo = self.repos.get(repo_id)
        if repo is None:
            self.error(h, 404, "RepoNotFound", "Repository not found", head)
            return None, None
        if not self.authorized(h, repo, head):
            return None, None
        sha = repo.commit(rev)
        if sha is None:
            self.error(h, 404, "RevisionNotFound", "Invalid rev id: " + rev, head)
            return None, None
        return repo, sha

    def api(self, h, repo_id, rev, head):
        repo, sha = self.find(h, repo_id, rev, head)
        if repo is None:
            return
        if self.api_body is not None:
            return self.send(h, 200, self.api_body, [("Content-Type", "text/html")], head)
        sib = []
        for name, data in sorted(repo.commits[sha].items()):
            key = (repo_id, sha, name)
            if key not in self.digests:  # hashed once per file, not per request
                self.digests[key] = (git_blob_id(data), hashlib.sha256(data).hexdigest())
            blob_id, digest = self.digests[key]
            s = {"rfilename": name, "size": len(data), "blobId": blob_id}
            if name.endswith(LFS_SUFFIXES):
                s["lfs"] = {"sha256": digest, "size": len(data), "pointerSize": 134}
            sib.append(s)
        body = json.dumps({"id": repo_id, "sha": sha, "siblings": sib}).encode()
        self.send(h, 200, body, [("Content-Type", "application/json")], head)

    def resolve(self, h, repo_id, rev, name, head):
        repo, sha = self.find(h, repo_id, rev, head)
        if repo is None:
            return
        if repo.gated:
            return self.error(h, 403, "GatedRepo", "Access to model %s is restricted. You must have access to it "
                              "and be authenticated to access it. Please log in." % repo_id, head)
        data = repo.commits[sha].get(name)
        if data is None:
            return self.error(h, 404, "EntryNotFound", "Entry not found", head)
        common = [("X-Repo-Commit", sha)]
        if name.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            with self.lock:
                self.blobs_by_sha = getattr(self, "blobs_by_sha", {})
                self.blobs_by_sha[digest] = (name, data)
            return self.send(h, 302, b"", common + [
                ("Location", self.cdn_url + "/cdn/" + digest), ("ETag", '"%s"' % git_blob_id(data)),
                ("X-Linked-Etag", '"%s"' % digest), ("X-Linked-Size", str(len(data)))], head)
        self.body(h, name, data, common + [("ETag", '"%s"' % git_blob_id(data))], head)

    def cdn(self, h, digest, head):
        found = getattr(self, "blobs_by_sha", {}).get(digest)
        if found is None:
            return self.error(h, 404, None, "no such object", head)
        self.body(h, found[0], found[1], [("ETag", '"%s"' % digest)], head)

    def body(self, h, name, data, headers, head):
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.send(h, 416, b"", [("Content-Range", "bytes */%d" % len(data))], head)
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        part = data[start:]
        h.send_response(206 if start else 200)
        for k, v in headers:
            h.send_header(k, v)
        if start:
            h.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(part)))
        h.end_headers()
        if head:
            return
        with self.lock:
            drop = self.drops.get(name)
            cut = None
            if drop and drop[1] > 0:
                drop[1] -= 1
                cut = drop[0]
        if cut is not None and cut < len(part):
            h.wfile.write(part[:cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)  # the connection drops mid-file
            return
        h.wfile.write(part)

    def requests(self, kind=None):
        with self.lock:
            return [r for r in self.log if kind is None or kind in r[1]]
