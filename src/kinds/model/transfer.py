#!/usr/bin/env python3
"""sparkform's model-weights transfer program (the `model` kind runs it on the nodes).

It runs with `python3 -c` or as a mounted file in a one-shot container of the deployment's
vLLM image. Python >= 3.9, the standard library only, plus `huggingface_hub` for `download`.

Modes (stdout: one JSON object per line; stderr: what went wrong, for a person):

  resolve REPO REVISION          the commit REVISION points at, and the file manifest
  download REPO COMMIT           the hub's own client fetches the snapshot into the cache,
                                 then every file is checked against the manifest
  verify                         checks a snapshot already in the cache against the manifest and
                                 records it as verified (download ends with this)
  serve ADDRESS[,ADDRESS] PORT   serves a verified snapshot's files (ranged GETs) to peers, on
                                 each of the node's fabric addresses
  pull PEER[,PEER] PORT          fetches a verified snapshot from a peer that serves it, its
                                 connections spread over the peer's addresses (one per fabric)
  observe                        what the cache holds, compared with the manifest
  remove                         deletes one commit's snapshot (blobs other snapshots use stay)

Every JSON line has an "event": "progress" (bytes_done, bytes_total, rate_bps, files: the
files in flight with done/total), "file" (one file finished: verified, skipped or failed),
"start" (pull: the files to fetch, the files in flight "jobs" and why, "cores", "streams"),
"listening" (serve: bound, with the port), "served" (serve: a file or a range sent to a peer),
"warning", and last, on success, "result" with everything the caller records. On failure
the last line is {"event": "error", "code": N, "message": ...} and the same message goes to
stderr.

Exit codes:
  0  done (observe: observed, whatever it found; the differences are in the result)
  2  usage: bad arguments or a malformed manifest
  3  verification failed: a file's size or checksum differs from the manifest (nothing kept)
  4  the hub or the peer failed: unreachable, HTTP error, refused token, short response
  5  not found: repository, revision or file unknown to the hub, or no verified snapshot
  6  `huggingface_hub` is not installed (download only)
  7  local I/O error: the cache folder cannot be read or written, the disk is full
  8  interrupted (SIGTERM/SIGINT); what was verified so far is kept and recorded

The manifest (resolve's result, the input of download/pull/observe with --manifest):
  {"format": "sparkform-model-manifest/1", "repo", "revision", "commit", "total_bytes",
   "files": [{"path", "size", "blob", "sha256", "git_sha1"}]}
Large (LFS) files carry the hub's sha256. Small files are plain git blobs: the hub lists
their git blob sha1 (sha1 of "blob <size>\\0" + content), not a sha256, so they are checked
against that sha1 after download and their sha256 is computed then and recorded in the
verified manifest. Every file therefore ends with a sha256 that came from the hub (LFS) or
from bytes checked against the hub's sha1 (small files); pull and observe use those.
"blob" is the name huggingface_hub gives the file under blobs/ (its ETag: the sha256 for LFS
files, the git sha1 otherwise).

Layout: exactly huggingface_hub's cache (CACHE/models--ORG--NAME/{blobs,snapshots/COMMIT,
refs}), on every node, so vLLM finds the snapshot with HF_HUB_OFFLINE=1. The verified manifest
of a node is CACHE/models--ORG--NAME/sparkform/COMMIT.json (not under snapshots/, which the
hub's cache scanner requires to hold folders only). A file is in it only once its bytes
matched; it records size and mtime so a later run trusts an unchanged file without rereading
it (--deep rereads). pull fetches several files at once (--jobs; by default the cores usable
here less one, 2 to 16, no more than the files to fetch; the "start" event says how many), into
blobs/BLOB.sparkform-partial, the body moved from the socket to the file by splice(2) where the
kernel allows it (else read into a buffer and written), hashing while it streams (in a thread of
its own per file, reading the range just written through an mmap, so hashing overlaps receiving
and copies nothing) and starting the disk's writeback as it goes, and renames it to blobs/BLOB
only when the sha256 matches. A file under --split-at (1 GiB) is one GET: a killed transfer
leaves a prefix that a later pull resumes with a ranged GET (rehashing the prefix). A larger
file is preallocated and comes as ranged GETs of --range-bytes (64 MiB), --streams (4) at once,
each written at its offset; the hasher still reads the file in order, fed the longest prefix
written, and no range starts more than --streams ranges ahead of it. Each completed range is
recorded in BLOB.sparkform-partial.ranges (replaced atomically): a later pull rehashes the
recorded prefix and fetches only the ranges not recorded, never trusting the file's length. A
partial file is trusted by nothing else; a file whose hash fails is removed (a resumed one is
fetched once more from zero).

The token (download, resolve) comes from the environment variable named by --token-env
(default HF_TOKEN) or, with --token-stdin, from the first line of standard input; never from
the command line. It is never printed.

serve and pull need the transfer's own token, a random one per transfer that sparkform makes
(at least 32 characters): with --auth-stdin it is the first line of standard input (pull
with --manifest -: the manifest follows it). serve answers every request without it (as
"Authorization: Bearer TOKEN") with 403 and the same body, whatever the path or method, so
nothing tells whether a file is served; POST /stop needs it too. The comparison takes the same
time whatever the token sent (hmac.compare_digest).

Test hook (tests/fake/transfer.rs), read only when set: SPARKFORM_TEST_CORRUPT_SERVED=PATH@OFFSET
makes serve flip that byte of PATH in every response holding it.
"""

import argparse
import errno
import fcntl
import fnmatch
import glob
import hashlib
import hmac
import http.client
import http.server
import itertools
import json
import mmap
import os
import queue
import re
import select as io_select
import shutil
import signal
import socket
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

FORMAT = "sparkform-model-manifest/1"
VERIFIED_FORMAT = "sparkform-verified-manifest/1"
PARTIAL = ".sparkform-partial"
# next to a partial file fetched as ranges: the ranges completed (pull --split-at)
RANGES = ".ranges"
RANGES_FORMAT = "sparkform-partial-ranges/1"
CHUNK = 1 << 20
# pull: how much is written before the hasher gets the range, how far it may fall behind, and
# how often the written range is handed to the disk
WINDOW = 4 << 20
LAG = 64 << 20
WRITEBACK = 32 << 20
FADVISE = hasattr(os, "posix_fadvise")
# splice(2) (Python >= 3.10): cleared by --no-splice, or when the kernel refuses it
SPLICE = [hasattr(os, "splice")]
UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
HEX40_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_ENDPOINT = "https://huggingface.co"
# config.json keys the modules need (architecture preflight, memory check)
CONFIG_FACTS = ("architectures", "model_type", "torch_dtype", "dtype", "num_hidden_layers",
                "hidden_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "vocab_size", "num_experts", "num_local_experts")

EXIT_USAGE, EXIT_VERIFY, EXIT_REMOTE, EXIT_NOTFOUND, EXIT_NODEP, EXIT_IO, EXIT_INTR = 2, 3, 4, 5, 6, 7, 8

_out_lock = threading.Lock()


class Fail(Exception):
    def __init__(self, code, message, unreachable=False):
        super().__init__(message)
        self.code = code
        self.message = message
        # the hub did not answer at all (as opposed to answering no): what a node keeps may
        # stand in for it
        self.unreachable = unreachable


def emit(event, **fields):
    fields = dict(event=event, **fields)
    line = json.dumps(fields, separators=(",", ":"), sort_keys=False)
    with _out_lock:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass   # the caller stopped reading; what happens is still in the files and the record


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0
    return str(n)


# ------------------------------------------------------------------ manifest and cache layout

def storage_folder(cache, repo):
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def verified_path(cache, repo, commit):
    return os.path.join(storage_folder(cache, repo), "sparkform", commit + ".json")


def safe_rel(path):
    """A repository path as a relative local path, refusing anything that escapes the snapshot."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in path \
            or "\x00" in path:
        raise Fail(EXIT_USAGE, "manifest: unsafe file path %r" % path)
    return os.path.join(*parts)


def check_manifest(m, repo=None, commit=None, where="manifest"):
    if not isinstance(m, dict) or m.get("format") not in (FORMAT, VERIFIED_FORMAT):
        raise Fail(EXIT_USAGE, "%s: not a sparkform model manifest (format %r)"
                   % (where, m.get("format") if isinstance(m, dict) else None))
    if not COMMIT_RE.match(str(m.get("commit", ""))):
        raise Fail(EXIT_USAGE, "%s: commit %r is not a 40-hex commit" % (where, m.get("commit")))
    if repo is not None and m.get("repo") != repo:
        raise Fail(EXIT_USAGE, "%s is for repository %r, not %r" % (where, m.get("repo"), repo))
    if commit is not None and m["commit"] != commit:
        raise Fail(EXIT_USAGE, "%s is for commit %s, not %s" % (where, m["commit"], commit))
    files = m.get("files")
    if not isinstance(files, list):
        raise Fail(EXIT_USAGE, "%s: no file list" % where)
    seen = set()
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str) \
                or not isinstance(f.get("size"), int) or f["size"] < 0:
            raise Fail(EXIT_USAGE, "%s: malformed file entry %r" % (where, f))
        safe_rel(f["path"])
        if f["path"] in seen:
            raise Fail(EXIT_USAGE, "%s: %s listed twice" % (where, f["path"]))
        seen.add(f["path"])
        sha = f.get("sha256")
        g = f.get("git_sha1")
        if sha is not None and not HEX64_RE.match(sha):
            raise Fail(EXIT_USAGE, "%s: %s: sha256 %r is not 64 hex digits" % (where, f["path"], sha))
        if g is not None and not HEX40_RE.match(g):
            raise Fail(EXIT_USAGE, "%s: %s: git_sha1 %r is not 40 hex digits" % (where, f["path"], g))
        if sha is None and g is None:
            raise Fail(EXIT_USAGE, "%s: %s has neither sha256 nor git_sha1: it cannot be verified"
                       % (where, f["path"]))
        blob = f.get("blob") or sha or g
        if not re.match(r"^[0-9a-f]{40,64}$", blob):
            raise Fail(EXIT_USAGE, "%s: %s: blob name %r is not a hash" % (where, f["path"], blob))
        f["blob"] = blob
    return m


def read_json_file(path, what):
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise Fail(EXIT_IO, "%s %s cannot be read: %s" % (what, path, e))


def atomic_write_json(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Record:
    """A node's verified manifest, rewritten (atomically) after every verified file, so a run
    killed at any point keeps what it verified."""

    def __init__(self, cache, repo, manifest):
        self.path = verified_path(cache, repo, manifest["commit"])
        self.lock = threading.Lock()
        old = read_json_file(self.path, "verified manifest")
        self.files = {}
        if isinstance(old, dict) and old.get("format") == VERIFIED_FORMAT \
                and old.get("commit") == manifest["commit"] and isinstance(old.get("files"), list):
            for f in old["files"]:
                if isinstance(f, dict) and isinstance(f.get("path"), str):
                    self.files[f["path"]] = f
        self.base = {k: manifest.get(k) for k in ("repo", "revision", "commit")}
        self.wanted = {f["path"]: f for f in manifest["files"]}

    def trusted(self, snap, f):
        """The recorded entry of f if its file on disk is unchanged since it was verified."""
        r = self.files.get(f["path"])
        if not r or r.get("size") != f["size"] or r.get("blob") != f["blob"]:
            return None
        if f.get("sha256") and r.get("sha256") != f["sha256"]:
            return None
        try:
            st = os.stat(os.path.join(snap, safe_rel(f["path"])))
        except OSError:
            return None
        if st.st_size != f["size"] or st.st_mtime_ns != r.get("mtime_ns"):
            return None
        return r

    def add(self, f, sha256, mtime_ns):
        with self.lock:
            self.files[f["path"]] = dict(path=f["path"], size=f["size"], blob=f["blob"],
                                         sha256=sha256, git_sha1=f.get("git_sha1"),
                                         mtime_ns=mtime_ns)
            self._write()

    def drop(self, path):
        with self.lock:
            if self.files.pop(path, None) is not None:
                self._write()

    def save(self):
        with self.lock:
            self._write()

    def _write(self):
        # "files": what is verified on this node; "expected": the whole manifest, so observe
        # without --manifest still knows what is missing
        files = [self.files[p] for p in sorted(self.files) if p in self.wanted]
        expected = [dict((k, v) for k, v in f.items() if k in ("path", "size", "blob", "sha256", "git_sha1"))
                    for _, f in sorted(self.wanted.items())]
        doc = dict(format=VERIFIED_FORMAT, files=files, expected=expected, verified_at=int(time.time()),
                   total_bytes=sum(f["size"] for f in files), **self.base)
        atomic_write_json(self.path, doc)

    def complete(self):
        return all(p in self.files for p in self.wanted)

    def manifest(self):
        files = [dict((k, v) for k, v in self.files[p].items() if k != "mtime_ns")
                 for p in sorted(self.wanted) if p in self.files]
        return dict(format=VERIFIED_FORMAT, files=files,
                    total_bytes=sum(f["size"] for f in files), **self.base)


def hashers_for(f):
    h = {"sha256": hashlib.sha256()}
    if f.get("git_sha1"):
        g = hashlib.sha1()
        g.update(b"blob %d\x00" % f["size"])
        h["git_sha1"] = g
    return h


def mismatch(f, digests, size):
    """None when the bytes match every checksum the manifest has for f, else why not."""
    if size != f["size"]:
        return "size %d, expected %d" % (size, f["size"])
    for k in ("sha256", "git_sha1"):
        want = f.get(k)
        if want and digests.get(k) != want:
            return "%s %s, expected %s" % (k, digests.get(k), want)
    return None


def feed(hs, path, limit=None):
    """Feeds the file's first `limit` bytes (all of it by default) to the hashers; returns how
    many it read."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while limit is None or size < limit:
            n = fh.readinto(view if limit is None else view[:min(limit - size, CHUNK)])
            if not n:
                break
            size += n
            for h in hs.values():
                h.update(view[:n])
    return size


def hash_file(path, f):
    hs = hashers_for(f)
    size = feed(hs, path)
    return {k: h.hexdigest() for k, h in hs.items()}, size


def link_snapshot(storage, commit, f):
    """snapshots/COMMIT/PATH -> ../../blobs/BLOB, relative, as huggingface_hub makes it."""
    rel = safe_rel(f["path"])
    pointer = os.path.join(storage, "snapshots", commit, rel)
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    target = os.path.relpath(os.path.join(storage, "blobs", f["blob"]), os.path.dirname(pointer))
    if os.path.islink(pointer) and os.readlink(pointer) == target:
        return pointer
    tmp = pointer + PARTIAL + ".link"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    os.replace(tmp, pointer)
    return pointer


def select(files, include, exclude):
    """The same filter as huggingface_hub's allow_patterns/ignore_patterns (fnmatchcase, a
    trailing "/" matches the whole folder)."""
    def norm(ps):
        return [p + "*" if p.endswith("/") else p for p in ps] if ps else None
    inc, exc = norm(include), norm(exclude)
    out = []
    for f in files:
        if inc is not None and not any(fnmatch.fnmatchcase(f["path"], p) for p in inc):
            continue
        if exc is not None and any(fnmatch.fnmatchcase(f["path"], p) for p in exc):
            continue
        out.append(f)
    return out


def facts_of(cfg):
    """What the modules need from a config.json document: the architecture preflight and the
    memory check."""
    if not isinstance(cfg, dict):
        return None
    facts = {k: cfg[k] for k in CONFIG_FACTS if k in cfg}
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        facts["quantization"] = q.get("quant_method") or q.get("quant_type")
    text = cfg.get("text_config")
    if isinstance(text, dict):   # multimodal configs nest the language model's numbers
        facts["text_config"] = {k: text[k] for k in CONFIG_FACTS if k in text}
    return facts


def config_facts(path):
    try:
        with open(path, "rb") as fh:
            return facts_of(json.loads(fh.read().decode("utf-8")))
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ progress

class Progress:
    """Prints a progress line at most every `every` seconds, from the byte counters of the files
    in flight. Thread-safe: workers call add()."""

    def __init__(self, total, every=0.5, **extra):
        self.total = total
        self.done = 0
        self.every = every
        self.extra = extra
        self.active = {}
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.last = 0.0
        self.base = 0   # bytes that were there before this run (skipped, resumed): not in the rate

    def start(self, path, total, initial=0):
        with self.lock:
            self.active[path] = [initial, total]
            self.done += initial
            self.base += initial

    def add(self, path, n):
        with self.lock:
            self.done += n
            a = self.active.get(path)
            if a:
                a[0] += n
            now = time.monotonic()
            if now - self.last < self.every:
                return
            self.last = now
            snap = self._snapshot(now)
        emit("progress", **snap)

    def skip(self, n):
        with self.lock:
            self.done += n
            self.base += n

    def finish(self, path, rewind=0):
        with self.lock:
            self.active.pop(path, None)
            self.done -= rewind

    def set_done(self, done, active):
        with self.lock:
            self.done = done
            self.active = active
            snap = self._snapshot(time.monotonic())
        emit("progress", **snap)

    def _snapshot(self, now):
        dt = max(now - self.t0, 1e-6)
        return dict(bytes_done=self.done, bytes_total=self.total,
                    rate_bps=int(max(self.done - self.base, 0) / dt),
                    files=[dict(path=p, done=a[0], total=a[1]) for p, a in sorted(self.active.items())],
                    **self.extra)

    def rate(self):
        dt = max(time.monotonic() - self.t0, 1e-6)
        return int(max(self.done - self.base, 0) / dt)


# ------------------------------------------------------------------ hub access (stdlib)

def endpoint_of(args):
    return (args.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_get(url, token, what, timeout=30):
    req = urllib.request.Request(url, headers={"User-Agent": "sparkform-transfer/1",
                                               "Accept-Encoding": "identity"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        code = e.headers.get("X-Error-Code", "") if e.headers else ""
        if e.code == 401 or e.code == 403:
            raise Fail(EXIT_REMOTE, "%s: the hub refused access (HTTP %d%s): check the token, or "
                       "accept the model's licence on the hub" % (what, e.code,
                                                                  ", " + code if code else ""))
        if e.code == 404:
            raise Fail(EXIT_NOTFOUND, "%s: not found on the hub (HTTP 404%s)" % (what, ", " + code if code else ""))
        raise Fail(EXIT_REMOTE, "%s: the hub answered HTTP %d" % (what, e.code))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise Fail(EXIT_REMOTE, "%s: the hub at %s cannot be reached: %s (the model block's "
                   "`endpoint` sets where it is; without it, the image's HF_ENDPOINT or the public hub)" % (what, urllib.parse.urlsplit(url).netloc, reason),
                   unreachable=True)


def resolve_manifest(endpoint, repo, revision, token, include=None, exclude=None):
    q = urllib.parse.quote
    body, _ = hub_get("%s/api/models/%s/revision/%s" % (endpoint, repo, q(revision, safe="")),
                      token, "repository %s revision %s" % (repo, revision))
    try:
        info = json.loads(body.decode("utf-8"))
        commit = info["sha"]
    except (ValueError, KeyError, TypeError):
        raise Fail(EXIT_REMOTE, "repository %s: the hub's model info has no commit sha" % repo)
    if not COMMIT_RE.match(str(commit)):
        raise Fail(EXIT_REMOTE, "repository %s: the hub gave commit %r, not 40 hex digits" % (repo, commit))
    files = []
    url = "%s/api/models/%s/tree/%s?recursive=true&expand=false" % (endpoint, repo, commit)
    pages = 0
    while url:
        pages += 1
        if pages > 10000:
            raise Fail(EXIT_REMOTE, "repository %s: the hub's file list does not end" % repo)
        body, headers = hub_get(url, token, "file list of %s at %s" % (repo, commit))
        try:
            entries = json.loads(body.decode("utf-8"))
        except ValueError:
            raise Fail(EXIT_REMOTE, "repository %s: the hub's file list is not JSON" % repo)
        for e in entries if isinstance(entries, list) else []:
            if not isinstance(e, dict) or e.get("type") != "file":
                continue
            lfs = e.get("lfs") if isinstance(e.get("lfs"), dict) else None
            f = dict(path=e.get("path"), size=e.get("size"))
            if lfs:
                f["sha256"] = lfs.get("oid") or lfs.get("sha256")
                f["size"] = lfs.get("size", f["size"])
                f["git_sha1"] = None
                f["blob"] = f["sha256"]
            else:
                f["sha256"] = None
                f["git_sha1"] = e.get("oid")
                f["blob"] = f["git_sha1"]
            files.append(f)
        url = next_link(headers.get("Link", ""))
    files.sort(key=lambda f: f["path"])
    m = dict(format=FORMAT, repo=repo, revision=revision, commit=commit, files=files)
    check_manifest(m, where="the hub's file list of %s" % repo)
    m["files"] = select(m["files"], include, exclude)
    m["total_bytes"] = sum(f["size"] for f in m["files"])
    return m


def next_link(link):
    for part in link.split(","):
        m = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if m:
            return m.group(1)
    return None


def fetch_config_facts(endpoint, manifest, token):
    cfg = next((f for f in manifest["files"] if f["path"] == "config.json"), None)
    if cfg is None or cfg["size"] > 4 << 20:
        return None
    body, _ = hub_get("%s/%s/resolve/%s/config.json" % (endpoint, manifest["repo"], manifest["commit"]),
                      token, "config.json of %s" % manifest["repo"])
    hs = hashers_for(cfg)
    for h in hs.values():
        h.update(body)
    why = mismatch(cfg, {k: h.hexdigest() for k, h in hs.items()}, len(body))
    if why:
        raise Fail(EXIT_VERIFY, "config.json from the hub does not match its file list: %s" % why)
    try:
        return facts_of(json.loads(body.decode("utf-8")))
    except ValueError:
        return None


# ------------------------------------------------------------------ token and stdin

# The shortest transfer token serve and pull accept: sparkform's are 64 hex digits.
MIN_AUTH = 32


def read_inputs(args):
    """(token, manifest) from the environment and standard input: with --token-stdin (the hub
    token) or --auth-stdin (the transfer's token, serve and pull) the first line of stdin is the
    token; with --manifest - the rest of stdin is the manifest."""
    token = None
    manifest_text = None
    want_token_stdin = getattr(args, "token_stdin", False) or getattr(args, "auth_stdin", False)
    want_manifest_stdin = getattr(args, "manifest", None) == "-"
    if want_token_stdin or want_manifest_stdin:
        data = sys.stdin.buffer.read().decode("utf-8", "replace")
        if want_token_stdin:
            first, _, data = data.partition("\n")
            token = first.strip() or None
        if want_manifest_stdin:
            manifest_text = data
    if token is None and hasattr(args, "token_env"):
        token = os.environ.get(args.token_env) or None
    manifest = None
    if want_manifest_stdin:
        try:
            manifest = json.loads(manifest_text)
        except ValueError as e:
            raise Fail(EXIT_USAGE, "the manifest on standard input is not JSON: %s" % e)
    elif getattr(args, "manifest", None):
        manifest = read_json_file(args.manifest, "manifest")
        if manifest is None:
            raise Fail(EXIT_USAGE, "manifest %s does not exist" % args.manifest)
    return token, manifest


def transfer_token(args, token):
    """The transfer's token that serve requires and pull sends: read from stdin, never argv."""
    if not getattr(args, "auth_stdin", False):
        raise Fail(EXIT_USAGE, "%s needs the transfer's token: pass --auth-stdin with it as the first "
                   "line of standard input" % args.mode)
    if token is None or len(token) < MIN_AUTH or not re.match(r"^[\x21-\x7e]+$", token):
        raise Fail(EXIT_USAGE, "%s: the transfer's token on standard input is missing, shorter than %d "
                   "characters or not printable ASCII" % (args.mode, MIN_AUTH))
    return token


def cache_of(args):
    if args.cache:
        return os.path.abspath(args.cache)
    return os.path.join(os.path.abspath(args.hf_home), "hub")


# ------------------------------------------------------------------ resolve

def cmd_resolve(args):
    token, _ = read_inputs(args)
    ep = endpoint_of(args)
    try:
        m = resolve_manifest(ep, args.repo, args.revision, token, args.include, args.exclude)
        if not args.no_config:
            m["config"] = fetch_config_facts(ep, m, token)
    except Fail as e:
        # With the hub unreachable, a revision this node keeps is resolved as it was when it
        # was downloaded: its commit (refs/REVISION, or the commit itself) and the manifest
        # recorded then. A revision it does not keep still needs the hub.
        if not e.unreachable or not args.cache:
            raise
        m = kept_revision(os.path.abspath(args.cache), args.repo, args.revision)
        if m is None:
            raise Fail(EXIT_REMOTE, "%s; and this node keeps no complete snapshot of %s at %s, so "
                       "it cannot be resolved without the hub (a node keeps its last "
                       "`keep_revisions` revisions)" % (e.message, args.repo, args.revision))
        m["files"] = select(m["files"], args.include, args.exclude)
        m["total_bytes"] = sum(f["size"] for f in m["files"])
        snap = os.path.join(storage_folder(os.path.abspath(args.cache), args.repo), "snapshots", m["commit"])
        if not args.no_config:
            m["config"] = config_facts(os.path.join(snap, "config.json"))
        m["offline"] = e.message
        emit("warning", message="the hub cannot be reached: %s at %s is the commit %s this node "
             "keeps, with the manifest recorded when it was downloaded" % (args.repo, args.revision, m["commit"]))
    emit("result", mode="resolve", **m)


def kept_manifest(cache, repo, commit):
    """The manifest recorded when COMMIT was verified on this node (every file's name, size and
    hashes, as the hub listed them then), when the node verified every file of it; else None."""
    try:
        doc = read_json_file(verified_path(cache, repo, commit), "verified manifest")
    except Fail:
        return None
    if not isinstance(doc, dict) or doc.get("format") != VERIFIED_FORMAT \
            or doc.get("commit") != commit or not isinstance(doc.get("expected"), list) \
            or not doc["expected"] or not isinstance(doc.get("files"), list):
        return None
    have = {f.get("path") for f in doc["files"] if isinstance(f, dict)}
    m = dict(format=FORMAT, repo=repo, revision=doc.get("revision") or commit, commit=commit,
             files=[dict(f) for f in doc["expected"] if isinstance(f, dict)])
    try:
        check_manifest(m, repo, commit, where="the manifest recorded on this node")
    except Fail:
        return None
    if any(f["path"] not in have for f in m["files"]):
        return None
    m["total_bytes"] = sum(f["size"] for f in m["files"])
    return m


def kept_revision(cache, repo, revision):
    """kept_manifest of the commit REVISION names on this node: itself, or what refs/REVISION
    (written when it was downloaded) holds."""
    commit = revision
    if not COMMIT_RE.match(revision):
        if revision.startswith("/") or any(p in ("", ".", "..") for p in revision.split("/")):
            return None
        try:
            with open(os.path.join(storage_folder(cache, repo), "refs", *revision.split("/"))) as fh:
                commit = fh.read().strip()
        except OSError:
            return None
        if not COMMIT_RE.match(commit):
            return None
    m = kept_manifest(cache, repo, commit)
    if m is not None:
        m["revision"] = revision
    return m


# ------------------------------------------------------------------ verification (download, observe)

def verify_snapshot(cache, manifest, deep, progress=None, remove_bad=False):
    """Checks every file of the manifest in the local snapshot. Returns (record, problems) where
    problems is a list of dicts (path, kind: missing|size|checksum, detail)."""
    storage = storage_folder(cache, manifest["repo"])
    snap = os.path.join(storage, "snapshots", manifest["commit"])
    rec = Record(cache, manifest["repo"], manifest)
    problems = []
    for f in manifest["files"]:
        p = os.path.join(snap, safe_rel(f["path"]))
        if not deep and rec.trusted(snap, f):
            if progress:
                progress.skip(f["size"])
            continue
        try:
            st = os.stat(p)
        except FileNotFoundError:
            problems.append(dict(path=f["path"], kind="missing", size=f["size"]))
            rec.drop(f["path"])
            continue
        except OSError as e:
            raise Fail(EXIT_IO, "%s cannot be read: %s" % (p, e))
        if st.st_size != f["size"]:
            problems.append(dict(path=f["path"], kind="size", size=f["size"], actual=st.st_size))
            rec.drop(f["path"])
            if remove_bad:
                remove_file(storage, manifest["commit"], f)
            continue
        try:
            digests, size = hash_file(p, f)
        except OSError as e:
            raise Fail(EXIT_IO, "%s cannot be read: %s" % (p, e))
        if progress:
            progress.skip(size)
        why = mismatch(f, digests, size)
        if why:
            problems.append(dict(path=f["path"], kind="checksum", size=f["size"], detail=why))
            rec.drop(f["path"])
            if remove_bad:
                remove_file(storage, manifest["commit"], f)
            continue
        rec.add(f, digests["sha256"], st.st_mtime_ns)
        emit("file", path=f["path"], status="verified", bytes=size, sha256=digests["sha256"])
    return rec, problems


def remove_file(storage, commit, f):
    """Removes the pointer and the blob of a file that failed its check, so the hub's client
    downloads it again instead of trusting it."""
    pointer = os.path.join(storage, "snapshots", commit, safe_rel(f["path"]))
    target = None
    if os.path.islink(pointer):
        target = os.path.realpath(pointer)
    for p in (pointer, target, os.path.join(storage, "blobs", f["blob"])):
        if p:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def write_ref(cache, repo, ref, commit):
    if ref:
        if ref.startswith("/") or any(p in ("", ".", "..") for p in ref.split("/")):
            raise Fail(EXIT_USAGE, "--ref %r is not a branch or tag name" % ref)
        path = os.path.join(storage_folder(cache, repo), "refs", *ref.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as fh:
            fh.write(commit)
        os.replace(tmp, path)


def problem_text(problems):
    return "; ".join("%s: %s" % (p["path"], p.get("detail") or
                                 ("missing" if p["kind"] == "missing" else
                                  "size %s, expected %s" % (p.get("actual"), p["size"])))
                     for p in problems[:5]) + (" (and %d more)" % (len(problems) - 5) if len(problems) > 5 else "")


# ------------------------------------------------------------------ download

def cmd_download(args):
    if not COMMIT_RE.match(args.commit):
        raise Fail(EXIT_USAGE, "download needs the pinned 40-hex commit, not %r (resolve gives it)" % args.commit)
    token, manifest = read_inputs(args)
    cache = cache_of(args)
    ep = endpoint_of(args)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ["HF_ENDPOINT"] = ep
    try:
        from huggingface_hub import snapshot_download
        import huggingface_hub
    except ImportError:
        raise Fail(EXIT_NODEP, "download needs huggingface_hub, which this Python (%s) lacks: run it in "
                   "the deployment's vLLM image, or pip install huggingface_hub" % sys.executable)
    # A commit this node keeps is checked against the manifest recorded when it was downloaded:
    # the hub is asked only for bytes the node does not have.
    kept = False
    if manifest is None:
        manifest = kept_manifest(cache, args.repo, args.commit)
        kept = manifest is not None
    if manifest is None:
        manifest = resolve_manifest(ep, args.repo, args.commit, token, args.include, args.exclude)
    else:
        check_manifest(manifest, args.repo, args.commit)
        manifest["files"] = select(manifest["files"], args.include, args.exclude)
    total = sum(f["size"] for f in manifest["files"])
    storage = storage_folder(cache, args.repo)
    snap = os.path.join(storage, "snapshots", args.commit)
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        raise Fail(EXIT_IO, "the cache folder %s cannot be created: %s" % (cache, e))

    # Files already verified and unchanged are not handed to the hub's client at all.
    rec0 = Record(cache, args.repo, manifest)
    todo = [f for f in manifest["files"] if not rec0.trusted(snap, f)]
    progress = Progress(total, node_role="download")
    stop = threading.Event()

    def watch():
        # The hub's client reports progress through tqdm; watching the blobs folder works with
        # every version of it: finished blobs by name, partial ones as BLOB.*.incomplete.
        by_blob = {}
        for f in manifest["files"]:
            by_blob.setdefault(f["blob"], []).append(f)
        blobs = os.path.join(storage, "blobs")
        while not stop.wait(1.0):
            done, active = 0, {}
            try:
                names = os.listdir(blobs)
            except OSError:
                names = []
            sizes = {}
            for n in names:
                try:
                    sizes[n] = os.stat(os.path.join(blobs, n)).st_size
                except OSError:
                    pass
            for f in manifest["files"]:
                if f["blob"] in sizes:
                    done += f["size"]
            for n, s in sizes.items():
                if n.endswith(".incomplete"):
                    b = n.split(".", 1)[0]
                    for f in by_blob.get(b, []):
                        active[f["path"]] = [s, f["size"]]
                        done += s
            progress.set_done(min(done, total), active)

    def fetch(files):
        if not files:
            return
        # exact paths, escaped: a "[" in a file name is not a pattern
        kw = dict(revision=args.commit, cache_dir=cache, max_workers=args.jobs,
                  allow_patterns=[glob.escape(f["path"]) for f in files], token=token or False)
        try:
            snapshot_download(args.repo, **kw)
        except Exception as e:   # the hub's client raises many types; its message says which
            name = type(e).__name__
            code = EXIT_NOTFOUND if "NotFound" in name else EXIT_REMOTE
            if isinstance(e, OSError) and getattr(e, "errno", None) is not None:
                code = EXIT_IO
            raise Fail(code, "huggingface_hub %s could not download %s at %s: %s: %s"
                       % (huggingface_hub.__version__, args.repo, args.commit, name,
                          str(e).splitlines()[0] if str(e) else ""))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.monotonic()
    refetched = []

    def refetch(problems):
        # what failed its check was removed (blob and pointer): fetched once more, checked again
        bad = {p["path"] for p in problems}
        files = [f for f in manifest["files"] if f["path"] in bad]
        emit("warning", message="%d file(s) failed verification and are fetched again: %s"
             % (len(problems), problem_text(problems)))
        try:
            fetch(files)
        except Fail as e:
            if e.code not in (EXIT_REMOTE, EXIT_NOTFOUND):
                raise
            raise Fail(EXIT_VERIFY, "%d file(s) of %s at %s do not match the manifest %s (%s) and "
                       "were removed; fetching them again from the hub failed: %s"
                       % (len(problems), args.repo, args.commit,
                          "recorded when it was downloaded" if kept else "of the hub",
                          problem_text(problems), e.message))
        return files

    try:
        if kept:
            # The node's own snapshot first: a file whose record no longer trusts it (a touched
            # or changed file) is hashed again, and only what fails is fetched from the hub.
            todo = []
            rec, problems = verify_snapshot(cache, manifest, args.deep, remove_bad=True)
        else:
            fetch(todo)
            rec, problems = verify_snapshot(cache, manifest, args.deep, remove_bad=True)
        if problems:
            refetched = refetch(problems)
            rec, problems = verify_snapshot(cache, manifest, False, remove_bad=True)
    finally:
        stop.set()
        t.join()
    if problems:
        raise Fail(EXIT_VERIFY, "%d file(s) of %s at %s failed verification twice and were removed: %s"
                   % (len(problems), args.repo, args.commit, problem_text(problems)))
    write_ref(cache, args.repo, args.ref, args.commit)
    wall = time.monotonic() - t0
    got = sum(f["size"] for f in todo) + sum(f["size"] for f in refetched)
    emit("result", mode="download", repo=args.repo, commit=args.commit, snapshot=snap, hub_asked=bool(got) or not kept,
         manifest_path=rec.path, bytes_total=total, bytes_downloaded=got,
         files_downloaded=len(todo), files_refetched=[f["path"] for f in refetched], seconds=round(wall, 3), rate_bps=int(got / max(wall, 1e-6)),
         config=config_facts(os.path.join(snap, "config.json")), manifest=rec.manifest())


# ------------------------------------------------------------------ verify

def cmd_verify(args):
    _, manifest = read_inputs(args)
    if manifest is None:
        raise Fail(EXIT_USAGE, "verify needs the manifest (--manifest FILE or -)")
    check_manifest(manifest, args.repo, args.commit)
    cache = cache_of(args)
    rec, problems = verify_snapshot(cache, manifest, args.deep)
    if problems:
        raise Fail(EXIT_VERIFY, "%d file(s) of %s at %s do not match: %s"
                   % (len(problems), args.repo, args.commit, problem_text(problems)))
    write_ref(cache, args.repo, args.ref, args.commit)
    emit("result", mode="verify", repo=args.repo, commit=args.commit, manifest_path=rec.path,
         bytes_total=sum(f["size"] for f in manifest["files"]), manifest=rec.manifest())


# ------------------------------------------------------------------ serve

class ServeState:
    def __init__(self, files, snap, manifest, idle, max_rate, auth):
        self.auth = ("Bearer " + auth).encode("ascii")   # what every request must send
        self.refused = set()        # the peers a refusal was reported for (once each)
        self.max_rate = max_rate    # bytes/s per transfer, 0: unbounded
        self.files = files          # path -> local file
        self.snap = snap
        self.manifest = manifest
        self.idle = idle
        self.last = time.monotonic()
        self.inflight = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.bytes = 0
        self.reason = None
        # test hook, read only when set: SPARKFORM_TEST_CORRUPT_SERVED=PATH@OFFSET flips that
        # byte of PATH in every response that holds it (a peer whose copy went bad mid-range)
        hook = os.environ.get("SPARKFORM_TEST_CORRUPT_SERVED")
        self.corrupt = (hook.rsplit("@", 1)[0], int(hook.rsplit("@", 1)[1])) if hook else None

    def touch(self, d=0):
        with self.lock:
            self.inflight += d
            self.last = time.monotonic()


class ServeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sparkform-transfer"
    sys_version = ""

    def log_message(self, fmt, *a):
        pass

    def _send_json(self, code, doc):
        body = json.dumps(doc).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _allowed(self):
        """Whether the request carries the transfer's token; if not it is answered 403, the same
        answer for every path and method, and the connection is closed."""
        st = self.server.state
        sent = self.headers.get("Authorization", "").encode("latin-1", "replace")
        if hmac.compare_digest(sent, st.auth):
            return True
        self.close_connection = True
        self._send_json(403, {"error": "forbidden"})
        peer = self.client_address[0]
        with st.lock:
            first = peer not in st.refused
            st.refused.add(peer)
        if first:
            emit("warning", message="refused a request without this transfer's token from %s" % peer)
        return False

    def do_POST(self):
        st = self.server.state
        if not self._allowed():
            return
        if self.path == "/stop":
            self._send_json(200, {"stopping": True})
            st.reason = "stopped"
            st.stop.set()
        else:
            self._send_json(404, {"error": "unknown endpoint"})

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        st = self.server.state
        if not self._allowed():
            return
        st.touch(1)
        try:
            self._get(st)
        except (ConnectionError, TimeoutError) as e:
            # the peer went away mid-file: it resumes with a ranged GET
            emit("warning", message="%s: %s left: %s" % (self.path, self.client_address[0], e))
            self.close_connection = True
        finally:
            st.touch(-1)

    def _get(self, st):
        if self.path == "/manifest":
            self._send_json(200, st.manifest)
            return
        if not self.path.startswith("/file/"):
            self._send_json(404, {"error": "unknown endpoint"})
            return
        rel = urllib.parse.unquote(self.path[len("/file/"):])
        local = st.files.get(rel)
        if local is None:
            self._send_json(404, {"error": "not in the verified manifest: %s" % rel})
            return
        try:
            fh = open(local, "rb")
        except OSError as e:
            self._send_json(500, {"error": "cannot open %s: %s" % (rel, e)})
            return
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start, end = 0, size - 1
            rng = self.headers.get("Range")
            code = 200
            if rng:
                m = re.match(r"^bytes=(\d+)-(\d*)$", rng.strip())
                if not m or int(m.group(1)) > size or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                    self.send_response(416)
                    self.send_header("Content-Range", "bytes */%d" % size)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = int(m.group(1))
                if m.group(2):
                    end = min(int(m.group(2)), size - 1)
                code = 206
            length = max(end - start + 1, 0)
            self.send_response(code)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            if code == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, start + length - 1, size))
            self.end_headers()
            if self.command == "HEAD" or length == 0:
                return
            self.wfile.flush()
            sent = 0
            # sendfile: the bytes go from the page cache to the socket without passing through Python
            step = 256 << 10 if st.max_rate else 64 << 20
            t0 = time.monotonic()
            bad = st.corrupt[1] if st.corrupt and st.corrupt[0] == rel and start <= st.corrupt[1] <= end else None
            while sent < length:
                if bad == start + sent:   # the test hook: this byte goes out flipped
                    n = self.connection.send(bytes([os.pread(fh.fileno(), 1, bad)[0] ^ 0xFF]))
                else:
                    count = min(length - sent, step, bad - start - sent if bad is not None and bad > start + sent else step)
                    n = self.connection.sendfile(fh, offset=start + sent, count=count)
                if not n:
                    break
                sent += n
                st.touch()
                if st.max_rate:   # after the last chunk too: a ranged GET of one chunk is paced as well
                    ahead = sent / st.max_rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            with st.lock:
                st.bytes += sent
            # `local`: the address it came in on, so a spread over two fabrics can be counted.
            emit("served", path=rel, bytes=sent, offset=start, peer=self.client_address[0],
                 local=self.connection.getsockname()[0])


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256   # each puller opens up to --jobs x --streams connections

    def server_bind(self):
        # HTTPServer's own server_bind resolves the bound address's name (socket.getfqdn): on
        # a fabric with no reverse DNS that waits out the resolver (10 s on the testbed) before
        # anything is served. The name is used for nothing here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port


def cmd_serve(args):
    addresses = [a.strip() for a in args.address.split(",")]
    if any(a in ("", "0.0.0.0", "::", "*") for a in addresses):
        raise Fail(EXIT_USAGE, "serve binds the node's fabric addresses, not %r" % args.address)
    token, _ = read_inputs(args)
    auth = transfer_token(args, token)
    cache = cache_of(args)
    path = verified_path(cache, args.repo, args.commit)
    doc = read_json_file(path, "verified manifest")
    if doc is None:
        raise Fail(EXIT_NOTFOUND, "no verified snapshot of %s at %s in %s: run download first"
                   % (args.repo, args.commit, cache))
    check_manifest(doc, args.repo, args.commit, where=path)
    snap = os.path.join(storage_folder(cache, args.repo), "snapshots", args.commit)
    # Serve only what is recorded as verified and still unchanged on disk.
    manifest = dict(doc)
    rec = Record(cache, args.repo, doc)
    ok = [f for f in doc["files"] if rec.trusted(snap, f) and f.get("sha256")]
    files = {f["path"]: os.path.join(snap, safe_rel(f["path"])) for f in ok}
    # The manifest a puller gets lists every file, served or not: a file left out here would
    # look complete to a puller that has no manifest of its own; one not served answers 404.
    full = {f["path"]: f for f in doc.get("expected") or []}
    full.update((f["path"], f) for f in doc["files"])
    manifest["files"] = [dict((k, v) for k, v in full[p].items() if k != "mtime_ns") for p in sorted(full)]
    manifest.pop("expected", None)
    stale = [p for p in sorted(full) if p not in files]
    if stale:
        emit("warning", message="%d file(s) not verified here (or changed since) are not served: %s"
             % (len(stale), ", ".join(stale[:5])))
    st = ServeState(files, snap, manifest, args.idle_timeout, args.max_rate, auth)
    # One server per address, all on the first one's port (an ephemeral one when 0).
    servers = []
    try:
        for a in addresses:
            servers.append(Server((a, servers[0].server_address[1] if servers else args.port), ServeHandler))
    except OSError as e:
        for srv in servers:
            srv.server_close()
        raise Fail(EXIT_IO, "cannot listen on %s:%d: %s (is it this node's address? is the port free?)"
                   % (a, args.port, e))
    for srv in servers:
        srv.state = st
        threading.Thread(target=srv.serve_forever, kwargs=dict(poll_interval=0.2), daemon=True).start()
    port = servers[0].server_address[1]
    emit("listening", address=addresses[0], addresses=addresses, port=port, files=len(files),
         bytes=sum(f["size"] for f in ok), stale=stale)
    deadline = time.monotonic() + args.max_time if args.max_time else None
    try:
        while not st.stop.wait(0.2):
            now = time.monotonic()
            with st.lock:
                idle = st.inflight == 0 and now - st.last > st.idle
            if idle:
                st.reason = "idle"
                break
            if deadline and now > deadline:
                st.reason = "max-time"
                break
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
    emit("result", mode="serve", reason=st.reason, bytes_served=st.bytes, port=port)


# ------------------------------------------------------------------ pull

class Peer:
    """The serving node, reached at one of its addresses (`hosts`, one per fabric): each thread
    (a file's worker, a range's stream) keeps one connection, to the address its turn gives it,
    so the transfers spread evenly over the fabrics."""

    def __init__(self, hosts, port, timeout, auth):
        self.hosts = [h.strip() for h in hosts.split(",") if h.strip()] or [hosts]
        self.port, self.timeout = port, timeout
        self.auth = "Bearer " + auth
        self.local = threading.local()
        self.turns = itertools.count()

    @property
    def host(self):
        h = getattr(self.local, "host", None)
        if h is None:
            h = self.local.host = self.hosts[next(self.turns) % len(self.hosts)]
        return h

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.local.c = c
        return c

    def reset(self):
        c = getattr(self.local, "c", None)
        if c is not None:
            c.close()
        self.local.c = None

    def request(self, path, headers=None):
        for attempt in (1, 2):
            c = self.conn()
            try:
                c.request("GET", path, headers=dict(headers or {}, Authorization=self.auth))
                resp = c.getresponse()
            except (http.client.HTTPException, OSError) as e:
                self.reset()
                if attempt == 2:
                    raise Fail(EXIT_REMOTE, "the peer %s:%d cannot be reached: %s" % (self.host, self.port, e))
                continue
            if resp.status == 403:
                self.reset()
                raise Fail(EXIT_REMOTE, "the peer %s:%d refused this transfer's token (HTTP 403): "
                           "is another transfer serving there?" % (self.host, self.port))
            return resp
        raise Fail(EXIT_REMOTE, "unreachable")


class RangeHasher:
    """sha256 (and git sha1) of the file's bytes in order, in a thread of its own, read back
    through an mmap of the page cache the receiver has just written: hashing copies nothing,
    so with splice the only copy of a byte is the one into the page cache, and hashlib releases
    the GIL on large buffers, so hashing overlaps receiving. The receiver hands over written
    ranges [a, b) in order; a bounded queue keeps the hasher at most LAG bytes behind, so the
    range is still in the page cache. Writeback of a range starts here, once it is hashed:
    POSIX_FADV_DONTNEED drops the clean pages of the range, which would make the hasher read
    them back from the disk."""

    def __init__(self, hs, fd, writeback):
        self.hs = list(hs.values())
        self.fd = fd
        self.writeback = writeback
        self.q = queue.Queue(maxsize=max(1, LAG // WINDOW))
        self.error = None
        self.buf = None   # set when the file cannot be mapped: read back with pread instead
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        flushed = None
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is not None:
                continue   # the receiver stops at its next add()
            a, b = item
            try:
                self._hash(a, b)
                flushed = a if flushed is None else flushed
                if self.writeback and b - flushed >= WRITEBACK:
                    os.posix_fadvise(self.fd, flushed, b - flushed, os.POSIX_FADV_DONTNEED)
                    flushed = b
            except Exception as e:   # kept for the receiver: a dead thread would leave it blocked on the queue
                self.error = e

    def _hash(self, a, b):
        if self.buf is None:
            base = a - a % mmap.ALLOCATIONGRANULARITY
            try:
                m = mmap.mmap(self.fd, b - base, flags=mmap.MAP_SHARED | MAP_POPULATE,
                              prot=mmap.PROT_READ, offset=base)
            except OSError:
                self.buf = bytearray(CHUNK)
            else:
                with m:
                    view = memoryview(m)
                    try:
                        for h in self.hs:
                            h.update(view[a - base:])
                    finally:
                        view.release()
                return
        view = memoryview(self.buf)
        while a < b:
            n = os.preadv(self.fd, [view[:min(b - a, CHUNK)]], a)
            if not n:
                raise OSError("the file is shorter than what was written to it")
            for h in self.hs:
                h.update(view[:n])
            a += n

    def add(self, a, b):
        self.check()
        self.q.put((a, b))

    def close(self):
        """Waits until every range added is hashed."""
        self.q.put(None)
        self.thread.join()

    def check(self):
        if self.error is not None:
            raise Fail(EXIT_IO, "the file cannot be read back to hash it: %s" % self.error)


def write_all(fd, view, path):
    try:
        while view:   # a write may take less than it is given
            view = view[os.write(fd, view):]
    except OSError as e:
        raise Fail(EXIT_IO, "%s cannot be written: %s" % (path, e))


def wait_readable(fd, timeout):
    """The socket has a timeout, so it is non-blocking underneath: wait for data as it would."""
    p = io_select.poll()
    p.register(fd, io_select.POLLIN | io_select.POLLERR | io_select.POLLHUP)
    if not p.poll(None if timeout is None else int(timeout * 1000)):
        raise socket.timeout("timed out")


class Splicer:
    """socket -> pipe -> file with splice(2): the kernel moves the bytes, one copy (into the
    page cache) instead of two (into Python's buffer, then out of it)."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.refused = False
        self.cap = 1 << 16
        if F_SETPIPE_SZ:
            try:
                self.cap = fcntl.fcntl(self.w, F_SETPIPE_SZ, CHUNK)
            except OSError:
                pass   # the default pipe works, with more calls

    def close(self):
        os.close(self.r)
        os.close(self.w)

    def move(self, sock, fd, want, timeout, path):
        """Up to `want` bytes from the socket to the file at its position: how many, 0 at the
        end of the stream, None when the kernel refuses splice from the socket. When it refuses
        splice into the file, what is already in the pipe goes there by read and write, and
        `refused` is set."""
        while True:
            try:
                n = os.splice(sock, self.w, min(want, self.cap), flags=os.SPLICE_F_MOVE)
                break
            except BlockingIOError:
                wait_readable(sock, timeout)
            except OSError as e:
                if e.errno in UNSUPPORTED:
                    return None
                raise
        left = n
        while left:
            try:
                left -= os.splice(self.r, fd, left, flags=os.SPLICE_F_MOVE)
            except OSError as e:
                if e.errno not in UNSUPPORTED:
                    raise Fail(EXIT_IO, "%s cannot be written: %s" % (path, e))
                while left:
                    b = os.read(self.r, left)
                    write_all(fd, memoryview(b), path)
                    left -= len(b)
                self.refused = True
                return n
        return n


def read_some(sock, view, timeout):
    while True:
        try:
            return os.readv(sock, [view])
        except BlockingIOError:
            wait_readable(sock, timeout)


def receive(resp, fd, got, size, hasher, progress, path, cancel, timeout):
    """Streams the response body into fd (positioned at `got`) up to `size`; returns the new
    offset. The body is read from the socket itself, past http.client (which has buffered at
    most its first bytes): by splice, or, where the kernel refuses it or with --no-splice, into
    a reused buffer and written out. Writeback to the disk is started every WRITEBACK bytes
    (POSIX_FADV_DONTNEED writes dirty pages back without waiting; with a hasher, once they are
    hashed), so the disk works while the network does and the final fsync finds little left:
    with a page cache larger than the file, nothing would reach the disk before that fsync
    otherwise, and the copy would be the network time plus the disk time."""
    if got >= size:
        return got
    buf = bytearray(CHUNK)
    pending = flushed = got   # pending: written, not yet hashed; flushed: handed to the disk
    # read1 returns what http.client has buffered (less than CHUNK), or does one read of the
    # socket: after it, nothing of the body is buffered, the socket holds the rest
    first = resp.read1(min(size - got, CHUNK))
    splicer = None
    try:
        write_all(fd, memoryview(first), path)
        got += len(first)
        progress.add(path, len(first))
        n = len(first)
        sock = resp.fileno() if n and got < size else None
        splicer = Splicer() if SPLICE[0] and sock is not None else None
        while n and got < size:
            if cancel.is_set():
                raise Fail(EXIT_INTR, "interrupted")
            n = splicer.move(sock, fd, size - got, timeout, path) if splicer else None
            if splicer and (n is None or splicer.refused):
                SPLICE[0] = False   # for the rest of the run: this kernel or file system refuses it
                splicer.close()
                splicer = None
            if n is None:
                view = memoryview(buf)[:min(size - got, CHUNK)]
                n = read_some(sock, view, timeout)
                write_all(fd, view[:n], path)
            got += n
            progress.add(path, n)
            if hasher is not None and got - pending >= WINDOW:
                hasher.add(pending, got)
                pending = got
            elif hasher is None and FADVISE and got - flushed >= WRITEBACK:
                os.posix_fadvise(fd, flushed, got - flushed, os.POSIX_FADV_DONTNEED)
                flushed = got
        if hasher is not None and got > pending:
            hasher.add(pending, got)
    finally:
        if splicer:
            splicer.close()
        # the body went past the response object: it must not wait for it on the next request
        # (after a short body the connection is unusable, and pull_one drops it)
        resp.close()
    return got


def kept_ranges(partial, side, size, split):
    """What of a partial file is trusted, as sorted disjoint byte ranges [a, b). With a sidecar
    (a file fetched as ranges: preallocated, so its length says nothing), the ranges it records
    as completed; without one, the file's bytes (one stream writes a prefix). For one stream
    the file is cut to the sidecar's prefix and the sidecar goes; for ranges a sidecar is
    written before the file can grow to its full size."""
    for tmp in glob.glob(glob.escape(side) + ".*.tmp"):   # a sidecar write a kill cut short
        unlink_quiet(tmp)
    if not os.path.exists(partial):
        if split:
            write_ranges(side, size, [])
        else:
            unlink_quiet(side)
        return []
    if os.path.exists(side):
        done = read_ranges(side, size)
    else:
        have = os.path.getsize(partial)
        if have > size:
            os.unlink(partial)
            return []
        done = [(0, have)] if have else []
        if split:
            write_ranges(side, size, done)
        return done
    if not split:
        prefix = done[0][1] if done and done[0][0] == 0 else 0
        done = [(0, prefix)] if prefix else []
        write_ranges(side, size, done)   # first, so a kill before the cut trusts no more
        os.truncate(partial, prefix)
        os.unlink(side)
    return done


def unlink_quiet(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def merge(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def read_ranges(side, size):
    """The completed ranges a sidecar records; none when it is unreadable or for another size."""
    try:
        with open(side, "rb") as fh:
            doc = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("format") != RANGES_FORMAT or doc.get("size") != size \
            or not isinstance(doc.get("done"), list):
        return []
    ok = [tuple(r) for r in doc["done"] if isinstance(r, list) and len(r) == 2
          and all(type(x) is int for x in r) and 0 <= r[0] < r[1] <= size]
    return merge(ok)


def write_ranges(side, size, done):
    # replaced atomically, not fsynced: a killed process loses nothing the kernel holds; after a
    # crash of the machine a range it names may not be on the disk, and the whole-file hash
    # fails (the file is then fetched again from zero)
    tmp = "%s.%d.%d.tmp" % (side, os.getpid(), threading.get_ident())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(dict(format=RANGES_FORMAT, size=size, done=[list(r) for r in done]), fh)
    os.replace(tmp, side)


def pieces(size, done, step):
    """The ranges of at most `step` bytes that cover what `done` leaves out, in file order."""
    out, x = [], 0
    for a, b in done + [(size, size)]:
        while x < a:
            e = min(a, x + step)
            out.append((x, e))
            x = e
        x = max(x, b)
    return out


def preallocate(fd, size, path):
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in UNSUPPORTED:
            raise Fail(EXIT_IO, "%s: %s cannot be allocated: %s" % (path, human(size), e))
        os.ftruncate(fd, max(size, os.fstat(fd).st_size))


class Either:
    def __init__(self, *events):
        self.events = events

    def is_set(self):
        return any(e.is_set() for e in self.events)


class Ranges:
    """One file fetched as ranged GETs of --range-bytes, --streams at once, each stream with its
    own connection and file descriptor, writing at its range's offset. The hasher still gets the
    file in order: after each window a stream writes, the longest prefix written (completed
    ranges, then the written part of the range in flight there) goes to it; a range ahead of that
    prefix waits in the page cache, and no stream starts a range more than --streams ranges ahead
    of it, so nothing is read back from the disk and memory stays bounded. Each completed range is
    recorded in the sidecar, so a killed pull refetches only the ranges not completed."""

    def __init__(self, size, done, step, streams, hasher, fed, side, cancel):
        self.size, self.side, self.hasher = size, side, hasher
        self.done = list(done)
        self.todo = pieces(size, self.done, step)
        self.todo.reverse()   # popped from the end: file order
        self.flight = {}      # start of a range in flight -> how far it is written
        self.fed = fed        # bytes handed to the hasher: a prefix of the file
        self.ahead = streams * step
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.cancel = Either(cancel, self.stop)
        self.error = None
        self.received = 0
        self.requests = 0

    def take(self):
        with self.lock:
            while self.todo and not self.cancel.is_set() and self.hasher is not None \
                    and self.todo[-1][0] - self.fed > self.ahead:
                self.lock.wait(0.2)
            if self.cancel.is_set() or not self.todo:
                return None
            a, b = self.todo.pop()
            self.flight[a] = a
            self.requests += 1
            return a, b

    def wrote(self, a, upto):
        with self.lock:
            self.flight[a] = upto
            self._feed()

    def complete(self, a, b):
        with self.lock:
            self.flight.pop(a, None)
            self.done = merge(self.done + [(a, b)])
            write_ranges(self.side, self.size, self.done)
            self._feed()
            self.lock.notify_all()

    def fail(self, e):
        with self.lock:
            if self.error is None or (self.error.code == EXIT_INTR and e.code != EXIT_INTR):
                self.error = e
            self.stop.set()
            self.lock.notify_all()

    def _feed(self):
        if self.hasher is None:
            return
        x = self.fed
        while x < self.size:
            e = next((e for s, e in self.done if s <= x < e), None)
            if e is None:
                e = next((w for s, w in self.flight.items() if s <= x < w), None)
            if e is None:
                break
            x = e
        if x > self.fed:
            self.hasher.add(self.fed, x)   # may wait for the hasher: the streams wait with it
            self.fed = x
            self.lock.notify_all()         # a stream waiting to start a range ahead

    def stream(self, peer, partial, path, progress):
        fd = None
        try:
            fd = os.open(partial, os.O_RDWR)
            while True:
                piece = self.take()
                if piece is None:
                    return
                a, b = piece
                resp = peer.request("/file/" + urllib.parse.quote(path), {"Range": "bytes=%d-%d" % (a, b - 1)})
                want = "bytes %d-%d/%d" % (a, b - 1, self.size)
                if resp.status != 206 or resp.getheader("Content-Range") != want:
                    resp.read()
                    if resp.status == 404:
                        raise Fail(EXIT_NOTFOUND, "the peer does not serve %s (not verified there)" % path)
                    raise Fail(EXIT_REMOTE, "the peer answered HTTP %d (%s) for %s, not %s"
                               % (resp.status, resp.getheader("Content-Range"), path, want))
                os.lseek(fd, a, os.SEEK_SET)
                try:
                    got = receive(resp, fd, a, b, Window(self, a) if self.hasher else None, progress, path,
                                  self.cancel, peer.timeout)
                except (OSError, http.client.HTTPException) as e:
                    raise Fail(EXIT_REMOTE, "the transfer of %s from the peer broke: %s" % (path, e))
                with self.lock:
                    self.received += got - a
                if got < b:
                    raise Fail(EXIT_REMOTE, "the peer sent %s of %s's range at %d and stopped"
                               % (human(got - a), path, a))
                self.complete(a, b)
        except Fail as e:
            self.fail(e if path in e.message else Fail(e.code, "%s: %s" % (path, e.message)))
        except OSError as e:
            self.fail(Fail(EXIT_IO, "%s: %s" % (path, e)))
        except Exception as e:   # a bug: the file must not count as copied all the same
            self.fail(Fail(EXIT_IO, "%s: internal error: %r" % (path, e)))
        finally:
            if fd is not None:
                os.close(fd)
            peer.reset()


class Window:
    """What receive() hands its hasher, for a range: how far the range starting at `a` is written."""

    def __init__(self, ranges, a):
        self.ranges, self.a = ranges, a

    def add(self, a, b):
        self.ranges.wrote(self.a, b)


def fetch_ranges(peer, fh, partial, side, f, done, fed, hs, progress, args, cancel):
    """The parts of f that `done` leaves out, as ranges at once; returns (bytes received, requests)."""
    preallocate(fh.fileno(), f["size"], f["path"])
    hasher = RangeHasher(hs, fh.fileno(), FADVISE) if hs else None
    rf = Ranges(f["size"], done, args.range_bytes, args.streams, hasher, fed, side, cancel)
    threads = [threading.Thread(target=rf.stream, args=(peer, partial, f["path"], progress), daemon=True)
               for _ in range(min(args.streams, len(rf.todo)))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if hasher:
            hasher.close()
    if rf.error:
        raise rf.error
    if hasher:
        hasher.check()
        if rf.fed != f["size"]:
            raise Fail(EXIT_IO, "%s: internal error: %d of %d bytes hashed" % (f["path"], rf.fed, f["size"]))
    return rf.received, rf.requests


def fetch_stream(peer, fh, have, f, hs, progress, cancel):
    """f from `have` on as one GET (ranged when resuming); returns the bytes received."""
    resp = peer.request("/file/" + urllib.parse.quote(f["path"]), {"Range": "bytes=%d-" % have} if have else {})
    if resp.status == 404:
        resp.read()
        raise Fail(EXIT_NOTFOUND, "the peer does not serve %s (not verified there)" % f["path"])
    if resp.status not in (200, 206) or (have and resp.status != 206):
        resp.read()
        raise Fail(EXIT_REMOTE, "the peer answered HTTP %d for %s" % (resp.status, f["path"]))
    hasher = RangeHasher(hs, fh.fileno(), FADVISE) if hs else None
    try:
        got = receive(resp, fh.fileno(), have, f["size"], hasher, progress, f["path"], cancel, peer.timeout)
    except (OSError, http.client.HTTPException) as e:
        peer.reset()
        raise Fail(EXIT_REMOTE, "the transfer of %s from the peer broke: %s" % (f["path"], e))
    except Fail:
        peer.reset()
        raise
    finally:
        if hasher:
            hasher.close()
    if hasher:
        hasher.check()
    if got < f["size"]:
        peer.reset()
        raise Fail(EXIT_REMOTE, "the peer sent %s of %s's %s and stopped"
                   % (human(got), f["path"], human(f["size"])))
    return got - have


def pull_one(peer, storage, commit, f, rec, progress, args, cancel):
    """Fetches one file into blobs/BLOB.sparkform-partial, resuming it, hashing while streaming;
    renames it into place only when it matches. A file of at least --split-at bytes comes as
    ranges at once (Ranges), its completed ranges recorded in BLOB.sparkform-partial.ranges.
    Returns the sha256 and the bytes it received (what was kept is not received again)."""
    blobs = os.path.join(storage, "blobs")
    final = os.path.join(blobs, f["blob"])
    partial = final + PARTIAL
    side = partial + RANGES
    os.makedirs(blobs, exist_ok=True)
    split = args.streams > 1 and f["size"] >= args.split_at and f["size"] > args.range_bytes
    received = 0
    for attempt in (1, 2):
        hs = hashers_for(f) if args.hash else {}
        done = kept_ranges(partial, side, f["size"], split)
        have = sum(b - a for a, b in done)
        prefix = done[0][1] if done and done[0][0] == 0 else 0
        requests = None
        # readable, for the hasher's mmap; not O_APPEND, which splice refuses
        fh = open(partial, "r+b" if os.path.exists(partial) else "w+b", buffering=0)
        try:
            if prefix and hs:
                # the kept prefix is hashed once here: the hash state of a killed run is lost
                feed(hs, partial, prefix)
            progress.start(f["path"], f["size"], have)
            if split:
                n, requests = fetch_ranges(peer, fh, partial, side, f, done, prefix, hs, progress, args, cancel)
            elif have < f["size"]:
                fh.seek(have)
                n = fetch_stream(peer, fh, have, f, hs, progress, cancel)
            else:
                n = 0
            received += n
            os.fsync(fh.fileno())
            size = os.fstat(fh.fileno()).st_size
        finally:
            fh.close()
        if args.hash:
            digests = {k: h.hexdigest() for k, h in hs.items()}
        else:
            digests = {"sha256": f.get("sha256")}
        why = mismatch(f, digests, size) if args.hash else (None if size == f["size"] else "size")
        unlink_quiet(side)   # before the rename, so a kill between them leaves a whole file, no sidecar
        if why:
            os.unlink(partial)
            progress.finish(f["path"], rewind=f["size"])
            if attempt == 1 and have:
                # what was kept may be what is wrong: once more from zero
                emit("warning", message="%s did not match after resuming (%s): fetching it again from zero"
                     % (f["path"], why))
                continue
            raise Fail(EXIT_VERIFY, "%s from the peer does not match the manifest: %s (removed)" % (f["path"], why))
        os.replace(partial, final)
        progress.finish(f["path"])
        pointer = link_snapshot(storage, commit, f)
        sha = digests.get("sha256")
        if args.hash:   # an unhashed copy is never recorded: a later run rereads it before trusting it
            rec.add(f, sha, os.stat(pointer).st_mtime_ns)
        extra = dict(ranges=requests, streams=args.streams) if requests is not None else {}
        emit("file", path=f["path"], status="verified" if args.hash else "copied", bytes=f["size"],
             resumed_from=have, sha256=sha, **extra)
        return sha, received
    raise Fail(EXIT_VERIFY, "%s does not match" % f["path"])


def cmd_pull(args):
    SPLICE[0] = SPLICE[0] and args.splice
    token, manifest = read_inputs(args)
    auth = transfer_token(args, token)
    cache = cache_of(args)
    peer = Peer(args.peer, args.port, args.timeout, auth)
    if manifest is None:
        resp = peer.request("/manifest")
        body = resp.read()
        if resp.status != 200:
            raise Fail(EXIT_REMOTE, "the peer answered HTTP %d for its manifest" % resp.status)
        try:
            manifest = json.loads(body.decode("utf-8"))
        except ValueError:
            raise Fail(EXIT_REMOTE, "the peer's manifest is not JSON")
        where = "the peer's manifest"
    else:
        where = "manifest"
    check_manifest(manifest, args.repo, args.commit, where=where)
    manifest["files"] = select(manifest["files"], args.include, args.exclude)
    if args.hash and any(not f.get("sha256") and not f.get("git_sha1") for f in manifest["files"]):
        raise Fail(EXIT_USAGE, "%s has files without a checksum" % where)
    storage = storage_folder(cache, args.repo)
    snap = os.path.join(storage, "snapshots", args.commit)
    try:
        os.makedirs(os.path.join(storage, "blobs"), exist_ok=True)
    except OSError as e:
        raise Fail(EXIT_IO, "the cache folder %s cannot be created: %s" % (cache, e))
    rec = Record(cache, args.repo, manifest)
    rec.save()   # before any byte moves, so observe knows what this node is to hold
    total = sum(f["size"] for f in manifest["files"])
    progress = Progress(total, node_role="pull", peer="%s:%d" % (",".join(peer.hosts), args.port))
    todo = []
    skipped = 0
    for f in manifest["files"]:
        if not args.deep and rec.trusted(snap, f):
            progress.skip(f["size"])
            skipped += 1
            emit("file", path=f["path"], status="skipped", bytes=f["size"])
            continue
        final = os.path.join(storage, "blobs", f["blob"])
        if os.path.isfile(final) and os.path.getsize(final) == f["size"]:
            # a blob renamed into place by a run killed before it recorded it (or shared with
            # another snapshot): reread once rather than fetch again
            digests, size = hash_file(final, f)
            if not mismatch(f, digests, size):
                pointer = link_snapshot(storage, args.commit, f)
                rec.add(f, digests["sha256"], os.stat(pointer).st_mtime_ns)
                progress.skip(size)
                skipped += 1
                emit("file", path=f["path"], status="verified", bytes=size, sha256=digests["sha256"])
                continue
            os.unlink(final)
        todo.append(f)
    # largest first, so the long transfers start at once
    todo.sort(key=lambda f: -f["size"])
    cancel = threading.Event()
    errors = []
    lock = threading.Lock()
    queue = list(todo)
    received = [0]
    t0 = time.monotonic()

    def worker():
        while not cancel.is_set():
            with lock:
                if not queue:
                    return
                f = queue.pop(0)
            try:
                _, n = pull_one(peer, storage, args.commit, f, rec, progress, args, cancel)
                with lock:
                    received[0] += n
            except Fail as e:
                with lock:
                    errors.append(e)
                emit("file", path=f["path"], status="failed", message=e.message)
                if e.code in (EXIT_IO, EXIT_INTR, EXIT_NOTFOUND):
                    cancel.set()
            except OSError as e:
                with lock:
                    errors.append(Fail(EXIT_IO, "%s: %s" % (f["path"], e)))
                cancel.set()
            except Exception as e:   # a bug: the file must not count as copied all the same
                with lock:
                    errors.append(Fail(EXIT_IO, "%s: internal error: %r" % (f["path"], e)))
                cancel.set()
        peer.reset()

    def on_signal(signum, frame):
        cancel.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    cores = usable_cores()
    jobs = args.jobs or max(2, min(16, cores - 1))
    jobs = max(1, min(jobs, len(todo)))
    emit("start", mode="pull", jobs=jobs, jobs_from="--jobs" if args.jobs else "cores", cores=cores,
         streams=args.streams, split_at=args.split_at, range_bytes=args.range_bytes, files=len(todo),
         bytes=sum(f["size"] for f in todo), files_skipped=skipped)
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    for s, h in old.items():
        signal.signal(s, h)
    wall = time.monotonic() - t0
    got = received[0]
    if cancel.is_set() and not errors:
        raise Fail(EXIT_INTR, "interrupted: %d file(s) verified and kept, the rest left as partial files"
                   % sum(1 for f in manifest["files"] if f["path"] in rec.files))
    if errors:
        worst = min(errors, key=lambda e: {EXIT_VERIFY: 0}.get(e.code, 1))
        raise Fail(worst.code, "%d file(s) not copied: %s" % (len(errors), "; ".join(e.message for e in errors[:3])))
    write_ref(cache, args.repo, args.ref, args.commit)
    emit("result", mode="pull", repo=args.repo, commit=args.commit, snapshot=snap,
         manifest_path=rec.path, bytes_total=total, bytes_copied=got, files_copied=len(todo),
         files_skipped=skipped, jobs=jobs, streams=args.streams, seconds=round(wall, 3),
         rate_bps=int(got / max(wall, 1e-6)),
         cpu_seconds=round(cpu_seconds(), 3), hashed=args.hash,
         config=config_facts(os.path.join(snap, "config.json")))


def usable_cores():
    """The cores this process may run on: its CPU affinity (a container's --cpuset-cpus), no more
    than its cgroup's CPU quota (--cpus) where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return n


def cpu_seconds():
    t = os.times()
    return t.user + t.system


# ------------------------------------------------------------------ observe

def cmd_observe(args):
    _, manifest = read_inputs(args)
    cache = cache_of(args)
    if manifest is None:
        path = verified_path(cache, args.repo, args.commit)
        manifest = read_json_file(path, "verified manifest")
        if manifest is None:
            emit("result", mode="observe", repo=args.repo, commit=args.commit, recorded=False,
                 present=[], missing=[], differ=[], missing_bytes=None,
                 message="no verified manifest on this node: pass the manifest with --manifest")
            return
        if isinstance(manifest, dict) and isinstance(manifest.get("expected"), list):
            manifest = dict(manifest, files=manifest["expected"])
    check_manifest(manifest, args.repo, args.commit)
    storage = storage_folder(cache, args.repo)
    snap = os.path.join(storage, "snapshots", args.commit)
    rec = Record(cache, args.repo, manifest)
    present, missing, differ = [], [], []
    for f in manifest["files"]:
        p = os.path.join(snap, safe_rel(f["path"]))
        try:
            st = os.stat(p)
        except FileNotFoundError:
            missing.append(dict(path=f["path"], size=f["size"]))
            continue
        except OSError as e:
            raise Fail(EXIT_IO, "%s cannot be read: %s" % (p, e))
        if st.st_size != f["size"]:
            differ.append(dict(path=f["path"], size=f["size"], actual_size=st.st_size, why="size"))
            continue
        verified = rec.trusted(snap, f) is not None
        if args.deep:
            try:
                digests, size = hash_file(p, f)
            except OSError as e:
                raise Fail(EXIT_IO, "%s cannot be read: %s" % (p, e))
            why = mismatch(f, digests, size)
            if why:
                differ.append(dict(path=f["path"], size=f["size"], why="checksum", detail=why))
                continue
            verified = True
        present.append(dict(path=f["path"], size=f["size"], verified=verified))
    emit("result", mode="observe", repo=args.repo, commit=args.commit, recorded=True, deep=args.deep,
         present=present, missing=missing, differ=differ,
         missing_bytes=sum(f["size"] for f in missing) + sum(f["size"] for f in differ),
         total_bytes=sum(f["size"] for f in manifest["files"]),
         complete=not missing and not differ and all(p["verified"] for p in present),
         config=config_facts(os.path.join(snap, "config.json")) if not missing else None)


# ------------------------------------------------------------------ remove

def cmd_remove(args):
    """Removes one commit's snapshot from a node: its folder, its record, the refs that point at
    it, its partial files, and the blobs no other snapshot links to (blobs are shared by name)."""
    cache = cache_of(args)
    storage = storage_folder(cache, args.repo)
    snaps = os.path.join(storage, "snapshots")
    snap = os.path.join(snaps, args.commit)

    def blobs_of(folder):
        out = set()
        for root, _, names in os.walk(folder):
            for n in names:
                p = os.path.join(root, n)
                if os.path.islink(p):
                    out.add(os.path.basename(os.readlink(p)))
        return out

    mine = blobs_of(snap) if os.path.isdir(snap) else set()
    rec = read_json_file(verified_path(cache, args.repo, args.commit), "verified manifest")
    if isinstance(rec, dict):
        mine |= {f.get("blob") for f in (rec.get("expected") or []) + (rec.get("files") or [])
                 if isinstance(f, dict) and f.get("blob")}
    others = set()
    for c in os.listdir(snaps) if os.path.isdir(snaps) else []:
        if c != args.commit:
            others |= blobs_of(os.path.join(snaps, c))
    freed = 0
    blobs = os.path.join(storage, "blobs")
    for b in sorted(mine - others):
        for p in (os.path.join(blobs, b), os.path.join(blobs, b + PARTIAL), os.path.join(blobs, b + PARTIAL + RANGES)):
            try:
                freed += os.path.getsize(p)
                os.unlink(p)
            except FileNotFoundError:
                pass
    if os.path.isdir(snap):
        for root, dirs, names in os.walk(snap, topdown=False):
            for n in names:
                os.unlink(os.path.join(root, n))
            for d in dirs:
                os.rmdir(os.path.join(root, d))
        os.rmdir(snap)
    refs = []
    for root, _, names in os.walk(os.path.join(storage, "refs")):
        for n in names:
            p = os.path.join(root, n)
            with open(p) as fh:
                if fh.read().strip() == args.commit:
                    os.unlink(p)
                    refs.append(os.path.relpath(p, os.path.join(storage, "refs")))
    try:
        os.unlink(verified_path(cache, args.repo, args.commit))
    except FileNotFoundError:
        pass
    # The last commit gone: what huggingface_hub keeps beside it (refs, .no_exist, its lock
    # folder) goes too, unless a kept copy's record or a snapshot of another commit is left.
    records = os.path.join(storage, "sparkform")
    left = (os.listdir(snaps) if os.path.isdir(snaps) else []) + \
        [n for n in (os.listdir(records) if os.path.isdir(records) else []) if n.endswith(".json")]
    emptied = os.path.isdir(storage) and not left
    if emptied:
        for root, _, names in os.walk(os.path.join(storage, "blobs")):
            freed += sum(os.path.getsize(os.path.join(root, n)) for n in names)
        shutil.rmtree(storage)
        shutil.rmtree(os.path.join(cache, ".locks", os.path.basename(storage)), ignore_errors=True)
    emit("result", mode="remove", repo=args.repo, commit=args.commit, bytes_freed=freed,
         blobs_removed=len(mine - others), blobs_kept_shared=len(mine & others), refs_removed=refs,
         repo_folder_removed=emptied)


# ------------------------------------------------------------------ arguments

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Fail(EXIT_USAGE, "%s: %s (see --help)" % (self.prog, message))


def parser():
    p = Parser(prog="transfer.py", description="sparkform model weights: resolve, download, serve, pull, observe",
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 3)[2])
    sub = p.add_subparsers(dest="mode", parser_class=Parser)

    def common(sp, token=False, manifest=False, filters=True, where=True):
        if where:
            g = sp.add_mutually_exclusive_group(required=True)
            g.add_argument("--cache", help="the hub cache folder (HF_HUB_CACHE)")
            g.add_argument("--hf-home", help="HF_HOME: the cache is HF_HOME/hub")
        if token:
            sp.add_argument("--token-env", default="HF_TOKEN", help="environment variable holding the token")
            sp.add_argument("--token-stdin", action="store_true", help="the first line of stdin is the token")
            sp.add_argument("--endpoint", help="the hub (default: $HF_ENDPOINT or the public hub)")
        if manifest:
            sp.add_argument("--manifest", help="the manifest file, or - for standard input")
        if filters:
            sp.add_argument("--include", action="append", help="only files matching (fnmatch, repeatable)")
            sp.add_argument("--exclude", action="append", help="leave out files matching (repeatable)")

    r = sub.add_parser("resolve", help="commit and manifest of REPO at REVISION")
    r.add_argument("repo")
    r.add_argument("revision")
    r.add_argument("--no-config", action="store_true", help="do not fetch config.json for its facts")
    r.add_argument("--cache", help="the hub cache folder: with the hub unreachable, a revision it keeps "
                   "is resolved from the manifest recorded when it was downloaded")
    common(r, token=True, where=False)

    d = sub.add_parser("download", help="fetch the snapshot with huggingface_hub, then verify it")
    d.add_argument("repo")
    d.add_argument("commit")
    d.add_argument("--jobs", type=int, default=8)
    d.add_argument("--ref", help="also point refs/REF at the commit (e.g. main)")
    d.add_argument("--deep", action="store_true", help="rehash files already verified")
    common(d, token=True, manifest=True)

    s = sub.add_parser("serve", help="serve a verified snapshot on ADDRESS:PORT")
    s.add_argument("address")
    s.add_argument("port", type=int)
    s.add_argument("--repo", required=True)
    s.add_argument("--commit", required=True)
    s.add_argument("--idle-timeout", type=float, default=300.0, help="stop after this long without a request")
    s.add_argument("--max-time", type=float, default=0, help="stop after this long in any case (0: no bound)")
    s.add_argument("--max-rate", type=float, default=0,
                   help="bytes per second per transfer, to leave the link to a running cluster (0: no bound)")
    s.add_argument("--auth-stdin", action="store_true",
                   help="the first line of stdin is the transfer's token, which every request must send")
    common(s, filters=False)

    v = sub.add_parser("verify", help="check a snapshot against the manifest and record it as verified")
    v.add_argument("--repo", required=True)
    v.add_argument("--commit", required=True)
    v.add_argument("--ref", help="also point refs/REF at the commit (e.g. main)")
    v.add_argument("--deep", action="store_true", help="rehash files already verified")
    common(v, manifest=True, filters=False)

    pl = sub.add_parser("pull", help="fetch a verified snapshot from PEER:PORT")
    pl.add_argument("peer")
    pl.add_argument("port", type=int)
    pl.add_argument("--repo", required=True)
    pl.add_argument("--commit", required=True)
    pl.add_argument("--jobs", type=int, help="files fetched at once (default: the cores usable here less one, "
                    "2 to 16, no more than the files to fetch)")
    pl.add_argument("--streams", type=int, default=4,
                    help="ranged GETs at once for a file of at least --split-at bytes (1: one stream a file)")
    pl.add_argument("--split-at", type=int, default=1 << 30,
                    help="files of at least this many bytes come as ranges at once (default 1 GiB)")
    pl.add_argument("--range-bytes", type=int, default=64 << 20,
                    help="the size of each of those ranges (default 64 MiB)")
    pl.add_argument("--ref", help="also point refs/REF at the commit (e.g. main)")
    pl.add_argument("--deep", action="store_true", help="rehash files already verified")
    pl.add_argument("--timeout", type=float, default=60.0, help="socket timeout in seconds")
    pl.add_argument("--no-hash", dest="hash", action="store_false",
                    help="benchmarks only: skip the checksum (files are then recorded unverified)")
    pl.add_argument("--no-splice", dest="splice", action="store_false",
                    help="receive through a buffer rather than splice(2) (which is used where the kernel allows it)")
    pl.add_argument("--auth-stdin", action="store_true",
                    help="the first line of stdin is the transfer's token, sent with every request")
    common(pl, manifest=True)

    o = sub.add_parser("observe", help="compare the local snapshot with the manifest")
    o.add_argument("--repo", required=True)
    o.add_argument("--commit", required=True)
    o.add_argument("--deep", action="store_true", help="also compare checksums")
    common(o, manifest=True, filters=False)

    rm = sub.add_parser("remove", help="remove a commit's snapshot (blobs other snapshots share are kept)")
    rm.add_argument("--repo", required=True)
    rm.add_argument("--commit", required=True)
    common(rm, filters=False)
    return p


def main(argv):
    try:
        args = parser().parse_args(argv)
        if not args.mode:
            raise Fail(EXIT_USAGE, "a mode is needed: resolve, download, verify, serve, pull, observe or remove (see --help)")
        if hasattr(args, "port") and not 0 <= args.port <= 65535:
            raise Fail(EXIT_USAGE, "port %d is not 0..65535" % args.port)
        if getattr(args, "commit", None) is not None and args.mode != "download" \
                and not COMMIT_RE.match(args.commit):
            raise Fail(EXIT_USAGE, "--commit must be the 40-hex commit, not %r" % args.commit)
        if args.mode == "pull" and (args.jobs is not None and args.jobs < 1 or args.streams < 1
                                    or args.split_at < 1 or args.range_bytes < 4096):
            raise Fail(EXIT_USAGE, "pull: --jobs, --streams and --split-at must be positive, --range-bytes >= 4096")
        if args.mode == "pull" and not args.hash:
            emit("warning", message="--no-hash: files are copied without verification (benchmarks only)")
        {"resolve": cmd_resolve, "download": cmd_download, "verify": cmd_verify, "serve": cmd_serve,
         "pull": cmd_pull, "observe": cmd_observe, "remove": cmd_remove}[args.mode](args)
        return 0
    except Fail as e:
        emit("error", code=e.code, message=e.message)
        sys.stderr.write("transfer.py: error: %s\n" % e.message)
        return e.code
    except KeyboardInterrupt:
        emit("error", code=EXIT_INTR, message="interrupted")
        sys.stderr.write("transfer.py: interrupted\n")
        return EXIT_INTR
    except OSError as e:
        msg = "local I/O error: %s" % e
        emit("error", code=EXIT_IO, message=msg)
        sys.stderr.write("transfer.py: error: %s\n" % msg)
        return EXIT_IO


def _sigterm(signum, frame):
    raise KeyboardInterrupt()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    sys.exit(main(sys.argv[1:]))
