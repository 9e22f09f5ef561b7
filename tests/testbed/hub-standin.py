#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub, for the testbed: the endpoints huggingface_hub's
snapshot_download uses, serving generated repositories (standard library only).

Written against huggingface_hub 2.4.0 (the version pip picks for Python 3.11 in December
2026), whose snapshot_download of a branch does, in order:
  GET  /api/models/REPO/revision/REV             model info; "sha" is the commit
  GET  /api/models/REPO/tree/COMMIT?recursive=True&expand=False
                                                 the files: type, path, size, oid, lfs{oid,size,pointerSize}
                                                 (pages follow a Link: rel="next" header; one page here)
  HEAD /REPO/resolve/COMMIT/PATH                 per file: X-Repo-Commit, ETag (git sha1, or the sha256
                                                 for LFS files, whose X-Linked-Etag/X-Linked-Size it prefers),
                                                 Content-Length; no X-Xet-Hash, so it downloads over HTTP
  GET  /REPO/resolve/COMMIT/PATH                 the bytes; Range: bytes=N- when it resumes (206)
A pinned commit skips the first call. Errors carry X-Error-Code (RepoNotFound, RevisionNotFound,
EntryNotFound) as the hub's do; with --token-file every request needs that bearer token (401).

Generated repositories (deterministic: the same bytes and commit ids on every start):
  testbed/standin-qwen3      config.json (Qwen3ForCausalLM), generation_config.json, tokenizer files,
                             model-0000N-of-00003.safetensors (safetensors-shaped, --shard-mib each,
                             the last half that) and their index. Two commits: main points at the
                             first; the second changes config.json and the second shard.
  testbed/unsupported-arch   the same shape, architecture UnsupportedForCausalLM, 1 MiB shards.

Control (for tests; not part of the hub's API):
  GET  /_standin/repos                      repos, commits (ids, files with sizes and sha256), refs
  POST /_standin/move?repo=R&ref=main&to=C  move a branch to commit C (an id, or its index 0/1)
       (or write the commit id into DATA/refs/ORG/NAME/REF: refs are read on every request)
  GET  /_standin/log                        every file fetched, one JSON object per line (also in DATA/fetch.log)
  POST /_standin/log/clear                  empty it
  GET  /_standin/health                     "ok"

Settings come from the command line or, for the testbed container, from SF_HUB_* variables.
"""

import argparse
import hashlib
import http.server
import json
import os
import random
import re
import signal
import socketserver
import struct
import sys
import threading
import time
import urllib.parse

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def safetensors_bytes(seed, size, layer):
    """A file with the safetensors layout (u64 header length, JSON header, tensor bytes)."""
    rng = random.Random(seed)
    cols = 1024
    rows = max(size - 4096, 2 * cols) // (2 * cols)
    payload = rows * cols * 2
    header = {"__metadata__": {"format": "pt"},
              "model.layers.%d.mlp.weight" % layer: {"dtype": "BF16", "shape": [rows, cols],
                                                      "data_offsets": [0, payload]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + rng.randbytes(payload)


def repo_files(name, arch, shard_mib, variant):
    """path -> bytes for one commit of a generated repository."""
    shard = max(1, shard_mib) << 20
    sizes = [shard, shard, shard // 2]
    files = {}
    cfg = {
        "architectures": [arch], "model_type": "qwen3" if "Qwen3" in arch else "unsupported",
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 3,
        "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 40960,
        "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
        "_standin_commit_variant": variant,
    }
    files["config.json"] = (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()
    files["generation_config.json"] = b'{\n  "do_sample": true,\n  "temperature": 0.6\n}\n'
    vocab = {"<|endoftext|>": 0}
    vocab.update({"tok%d" % i: i + 1 for i in range(2000)})
    files["tokenizer.json"] = (json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab,
                                                                       "merges": []}}) + "\n").encode()
    files["tokenizer_config.json"] = b'{\n  "model_max_length": 40960,\n  "eos_token": "<|endoftext|>"\n}\n'
    files["vocab.json"] = (json.dumps(vocab) + "\n").encode()
    weight_map = {}
    total = 0
    for i, sz in enumerate(sizes, 1):
        p = "model-%05d-of-%05d.safetensors" % (i, len(sizes))
        seed = "%s/%d/%d" % (name, i, variant if i == 2 else 0)
        files[p] = safetensors_bytes(seed, sz, i - 1)
        weight_map["model.layers.%d.mlp.weight" % (i - 1)] = p
        total += len(files[p])
    files["model.safetensors.index.json"] = (json.dumps({"metadata": {"total_size": total},
                                                         "weight_map": weight_map}, indent=2) + "\n").encode()
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    return files


def is_lfs(path, data):
    return path.endswith(".safetensors") or len(data) > 10 << 20


class Hub:
    def __init__(self, data_dir, shard_mib, token):
        self.dir = data_dir
        self.token = token
        self.repos = {}   # name -> {"commits": [{"id", "files": {path: entry}}]}
        self.lock = threading.Lock()
        self.log_path = os.path.join(data_dir, "fetch.log")
        os.makedirs(os.path.join(data_dir, "objects"), exist_ok=True)
        for name, arch, mib in (("testbed/standin-qwen3", "Qwen3ForCausalLM", shard_mib),
                                ("testbed/unsupported-arch", "UnsupportedForCausalLM", 1)):
            self.add_repo(name, arch, mib)

    def add_repo(self, name, arch, mib):
        commits = []
        parent = ""
        for variant in (0, 1):
            files = {}
            meta = os.path.join(self.dir, "meta", name, "%d-%d.json" % (variant, mib))
            if os.path.exists(meta):
                with open(meta) as fh:
                    files = json.load(fh)
            if not files or not all(os.path.exists(self.obj(e)) for e in files.values()):
                files = {}
                for path, data in repo_files(name, arch, mib, variant).items():
                    sha = hashlib.sha256(data).hexdigest()
                    entry = {"path": path, "size": len(data), "oid": git_blob_sha1(data), "sha256": sha,
                             "lfs": is_lfs(path, data)}
                    obj = self.obj(entry)
                    if not os.path.exists(obj):
                        with open(obj + ".tmp", "wb") as fh:
                            fh.write(data)
                        os.replace(obj + ".tmp", obj)
                    files[path] = entry
                os.makedirs(os.path.dirname(meta), exist_ok=True)
                with open(meta + ".tmp", "w") as fh:
                    json.dump(files, fh, sort_keys=True)
                os.replace(meta + ".tmp", meta)
            tree = json.dumps(sorted((e["path"], e["oid"]) for e in files.values()))
            cid = hashlib.sha1(("%s\n%s\n%s" % (name, parent, tree)).encode()).hexdigest()
            parent = cid
            commits.append({"id": cid, "files": files})
        self.repos[name] = {"commits": commits}
        ref = self.ref_path(name, "main")
        if not os.path.exists(ref):
            self.set_ref(name, "main", commits[0]["id"])

    def obj(self, entry):
        return os.path.join(self.dir, "objects", entry["sha256"])

    def ref_path(self, repo, ref):
        return os.path.join(self.dir, "refs", repo, ref)

    def set_ref(self, repo, ref, commit):
        p = self.ref_path(repo, ref)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".tmp", "w") as fh:
            fh.write(commit + "\n")
        os.replace(p + ".tmp", p)

    def resolve(self, repo, rev):
        """(commit dict or None, reason)"""
        r = self.repos.get(repo)
        if r is None:
            return None, "RepoNotFound"
        by_id = {c["id"]: c for c in r["commits"]}
        if COMMIT_RE.match(rev):
            return by_id.get(rev), "RevisionNotFound"
        try:
            with open(self.ref_path(repo, rev)) as fh:
                cid = fh.read().strip()
        except (OSError, ValueError):
            return None, "RevisionNotFound"
        return by_id.get(cid), "RevisionNotFound"

    def log(self, rec):
        line = json.dumps(rec, sort_keys=True) + "\n"
        with self.lock:
            with open(self.log_path, "a") as fh:
                fh.write(line)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub-standin"
    sys_version = ""

    def log_message(self, fmt, *a):
        sys.stderr.write("[hub-standin] %s %s\n" % (self.client_address[0], fmt % a))

    @property
    def hub(self):
        return self.server.hub

    def send(self, code, body=b"", ctype="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, err, msg, commit=None):
        h = {"X-Error-Code": err, "X-Error-Message": msg}
        if commit:
            h["X-Repo-Commit"] = commit
        self.send(code, {"error": msg}, headers=h)

    def authorised(self):
        if not self.hub.token:
            return True
        if self.headers.get("Authorization", "") == "Bearer " + self.hub.token:
            return True
        self.error(401, "RepoNotFound", "Invalid credentials in Authorization header")
        return False

    def do_HEAD(self):
        self.route()

    def do_GET(self):
        self.route()

    def do_POST(self):
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        if u.path == "/_standin/move":
            repo, ref, to = q.get("repo", ""), q.get("ref", "main"), q.get("to", "")
            r = self.hub.repos.get(repo)
            if r is None:
                return self.error(404, "RepoNotFound", "no repository %s" % repo)
            ids = [c["id"] for c in r["commits"]]
            if to.isdigit() and int(to) < len(ids):
                to = ids[int(to)]
            if to not in ids:
                return self.error(404, "RevisionNotFound", "no commit %s in %s" % (to, repo))
            self.hub.set_ref(repo, ref, to)
            return self.send(200, {"repo": repo, "ref": ref, "commit": to})
        if u.path == "/_standin/log/clear":
            with self.hub.lock:
                open(self.hub.log_path, "w").close()
            return self.send(200, {"cleared": True})
        self.error(404, "NotFound", "unknown endpoint")

    def route(self):
        u = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(u.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        if path.startswith("/_standin/"):
            return self.control(path)
        if not self.authorised():
            return
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            return self.model_info(m.group(1), m.group(2) or "main", q)
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            return self.tree(m.group(1), m.group(2), m.group(3) or "", q)
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self.file(m.group(1), m.group(2), m.group(3))
        self.error(404, "NotFound", "the stand-in hub does not serve %s" % path)

    def control(self, path):
        if path == "/_standin/health":
            return self.send(200, "ok\n", "text/plain")
        if path == "/_standin/log":
            with self.hub.lock:
                try:
                    with open(self.hub.log_path, "rb") as fh:
                        body = fh.read()
                except FileNotFoundError:
                    body = b""
            return self.send(200, body, "application/x-ndjson")
        if path == "/_standin/repos":
            out = {}
            for name, r in self.hub.repos.items():
                refs = {}
                refdir = os.path.join(self.hub.dir, "refs", name)
                for ref in sorted(os.listdir(refdir)) if os.path.isdir(refdir) else []:
                    c, _ = self.hub.resolve(name, ref)
                    refs[ref] = c["id"] if c else None
                out[name] = {"refs": refs, "commits": [
                    {"id": c["id"], "files": [{"path": e["path"], "size": e["size"], "sha256": e["sha256"],
                                               "git_sha1": e["oid"], "lfs": e["lfs"]}
                                              for e in sorted(c["files"].values(), key=lambda e: e["path"])]}
                    for c in r["commits"]]}
            return self.send(200, out)
        self.error(404, "NotFound", "unknown control endpoint")

    def model_info(self, repo, rev, q):
        c, why = self.hub.resolve(repo, rev)
        if c is None:
            return self.error(404, why, "%s: %s not found" % (repo, rev))
        sib = []
        for e in sorted(c["files"].values(), key=lambda e: e["path"]):
            s = {"rfilename": e["path"]}
            if q.get("blobs", "").lower() in ("1", "true"):
                s.update(size=e["size"], blobId=e["oid"])
                if e["lfs"]:
                    s["lfs"] = {"size": e["size"], "sha256": e["sha256"], "pointerSize": 134}
            sib.append(s)
        self.send(200, {"_id": "standin", "id": repo, "modelId": repo, "author": repo.split("/")[0],
                        "sha": c["id"], "lastModified": "2026-12-01T00:00:00.000Z", "private": False,
                        "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                        "library_name": "transformers", "tags": ["standin"], "siblings": sib,
                        "createdAt": "2026-12-01T00:00:00.000Z"})

    def tree(self, repo, rev, sub, q):
        c, why = self.hub.resolve(repo, rev)
        if c is None:
            return self.error(404, why, "%s: %s not found" % (repo, rev))
        recursive = q.get("recursive", "").lower() in ("1", "true")
        out, dirs = [], set()
        prefix = sub.rstrip("/") + "/" if sub else ""
        for e in sorted(c["files"].values(), key=lambda e: e["path"]):
            if not e["path"].startswith(prefix):
                continue
            rest = e["path"][len(prefix):]
            if "/" in rest and not recursive:
                dirs.add(prefix + rest.split("/")[0])
                continue
            t = {"type": "file", "oid": e["oid"], "size": e["size"], "path": e["path"]}
            if e["lfs"]:
                t["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": 134}
            out.append(t)
        out = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)] + out
        self.send(200, out)

    def file(self, repo, rev, fpath):
        c, why = self.hub.resolve(repo, rev)
        if c is None:
            return self.error(404, why, "%s: %s not found" % (repo, rev))
        e = c["files"].get(fpath)
        if e is None:
            return self.error(404, "EntryNotFound", "%s not in %s at %s" % (fpath, repo, c["id"]), c["id"])
        size = e["size"]
        start, end, code = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"^bytes=(\d+)-(\d*)$", rng.strip())
            if not m or int(m.group(1)) >= size:
                return self.send(416, b"", headers={"Content-Range": "bytes */%d" % size})
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            code = 206
        length = end - start + 1
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", c["id"])
        if e["lfs"]:
            self.send_header("ETag", '"%s"' % e["oid"])
            self.send_header("X-Linked-Etag", '"%s"' % e["sha256"])
            self.send_header("X-Linked-Size", str(size))
        else:
            self.send_header("ETag", '"%s"' % e["oid"])
        if code == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        rec = {"t": round(time.time(), 3), "method": self.command, "repo": repo, "rev": rev,
               "commit": c["id"], "file": fpath, "client": self.client_address[0],
               "agent": self.headers.get("User-Agent", "")}
        if self.command == "HEAD":
            self.hub.log(dict(rec, bytes=0))
            return
        sent = 0
        with open(self.hub.obj(e), "rb") as fh:
            self.wfile.flush()
            while sent < length:
                n = self.connection.sendfile(fh, offset=start + sent, count=length - sent)
                if not n:
                    break
                sent += n
        self.hub.log(dict(rec, bytes=sent, range=rng, complete=(start == 0 and sent == size)))


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", default=env("SF_HUB_ADDRESS", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("SF_HUB_PORT", "8080")))
    p.add_argument("--data", default=env("SF_HUB_DATA", "/tmp/hub-standin"),
                   help="where the generated objects, refs and the fetch log live")
    p.add_argument("--shard-mib", type=int, default=int(env("SF_HUB_SHARD_MIB", "24")))
    p.add_argument("--token-file", default=env("SF_HUB_TOKEN_FILE") or None,
                   help="require this bearer token (the file's first line)")
    p.add_argument("--port-file", help="write the bound port here (with --port 0)")
    a = p.parse_args()
    token = None
    if a.token_file:
        with open(a.token_file) as fh:
            token = fh.readline().strip() or None
    t0 = time.time()
    hub = Hub(a.data, a.shard_mib, token)
    srv = Server((a.address, a.port), Handler)
    srv.hub = hub
    port = srv.server_address[1]
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as fh:
            fh.write("%d\n" % port)
        os.replace(a.port_file + ".tmp", a.port_file)
    sys.stderr.write("[hub-standin] serving %s on %s:%d (data %s, ready in %.1f s)\n"
                     % (", ".join(hub.repos), a.address, port, a.data, time.time() - t0))
    sys.stderr.flush()
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def _sigterm(signum, frame):
    sys.exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    main()
