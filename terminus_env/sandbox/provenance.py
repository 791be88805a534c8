"""Is code the verifier ran a Debian package's own? The proof's rules, over what the daemon gathered (no I/O: the
caller lends the decompressor of the archives Python cannot open, zstd's).

A program the agent installed with apt and one it wrote into the same place are both code the agent provided: the
watch cannot tell them apart, and the verifier's own tools run both (``apt-get update`` runs gpgconf, ``tar --zstd``
runs zstd). Provenance can. A file counts as a package's own only when its bytes, as the verifier loaded them, are
the member at the same path of a package archive that is trusted (a link, when the member is a link leading to the
same place), and an archive is trusted only when it is

- the image's own (unchanged in this container: the image's author put it there), or
- listed by its SHA-256 in a package index whose SHA-256 a release file lists, where that release file is signed by
  a key the image trusts (checked by ``gpgv`` against the image's keyrings as built, never the container's). An
  archive that such an index lists but the container no longer holds (an image whose apt deletes its archives after
  each install) is fetched from the image's own sources, as built, and checked by that hash
  (:func:`missing_archives`).

Nothing the agent can write makes a proof: dpkg's records and the archives' names only say where to look. A genuine
package's file proves only that it is that file; the rules that judge by place and by time still apply to it
(``shadowed``, ``startup_hook``, ``runner_config``, ``changed_during``): only ``loaded_before_tests`` and
``runtime_modified`` yield to a proof.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import io
import lzma
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from terminus_env.sandbox.tamper import Finding, TamperKind, WatchReport

__all__ = [
    "PACKAGED_DIRS", "PROVABLE", "Candidates", "PackageFacts", "Unzstd", "candidates", "deb_members",
    "missing_archives", "mirror_prefix", "proven", "release_hashes", "without_proven",
]  # fmt: skip

PACKAGED_DIRS = ("/usr/bin/", "/usr/sbin/", "/usr/lib/", "/usr/libexec/", "/usr/share/", "/bin/", "/sbin/", "/lib/",
                 "/lib32/", "/lib64/", "/libx32/", "/usr/lib32/", "/usr/lib64/", "/usr/libx32/")  # fmt: skip
"""Where Debian's packages put code (the daemon's watch hashes changed code here as it is loaded; the same tuple as
``inside/packages.py``)."""
PROVABLE = frozenset({TamperKind.LOADED_BEFORE_TESTS, TamperKind.RUNTIME_MODIFIED})
MAX_LINK_HOPS = 16
AR_MAGIC = b"!<arch>\n"
Unzstd = Callable[[bytes], "bytes | None"]
"""Decompresses a zstd stream (None if it cannot): the one step of a proof that needs a program."""


def _unreadable() -> tuple[type[Exception], ...]:
    errors: list[type[Exception]] = [tarfile.TarError, OSError, EOFError, ValueError, zlib.error, lzma.LZMAError]
    try:  # Python 3.14's tarfile opens zstd streams itself
        errors.append(importlib.import_module("compression.zstd").ZstdError)
    except (ImportError, AttributeError):
        pass
    return tuple(errors)


UNREADABLE = _unreadable()
"""What reading a package archive's data can raise: a bad header (``TarError``, ``ValueError``), a compressed
stream that is corrupt (``zlib.error``, ``LZMAError``, bz2's and gzip's ``OSError``, ``ZstdError``) or cut short
(``EOFError``). Such an archive proves nothing; it never fails the proof of the others, nor the grade."""


@dataclass(frozen=True)
class Candidates:
    """What a proof is asked for: files (path: SHA-256 as loaded) and links the agent made (path: where it led)."""

    files: Mapping[str, str]
    links: Mapping[str, str]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.files, *self.links}))


@dataclass(frozen=True)
class Index:
    path: str
    sha256: str
    listed: Mapping[str, str]
    """The archives it lists for the packages that own the candidates: hash, and where it lies on the mirror."""


@dataclass(frozen=True)
class Archive:
    path: str
    changed: bool
    data: bytes

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class PackageFacts:
    """The daemon's answer to ``packages``: where to look, and what is there (none of it trusted yet)."""

    merged: tuple[str, ...] = ()
    """Root folders that lead into /usr (``bin`` for ``/bin -> usr/bin``), as the image made them."""
    releases: tuple[tuple[str, bytes], ...] = ()
    indices: tuple[Index, ...] = ()
    archives: tuple[Archive, ...] = ()

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> PackageFacts:
        return cls(
            tuple(reply.get("merged", ())),
            tuple((item["path"], base64.b64decode(item["data"])) for item in reply.get("releases", ())),
            tuple(Index(item["path"], item["sha256"], {digest: filename for digest, filename in item["listed"]})
                  for item in reply.get("indices", ())),
            tuple(Archive(item["path"], bool(item["changed"]), base64.b64decode(item["data"]))
                  for item in reply.get("archives", ())),
        )  # fmt: skip


def candidates(findings: Iterable[Finding], report: WatchReport) -> Candidates:
    """The files and links behind the findings a proof could lift: a file needs its hash as loaded."""
    hashes = {used.path: used.sha256 for used in report.used if used.sha256}
    targets = {link.path: link.target for link in report.links}
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for finding in findings:
        if finding.kind not in PROVABLE or not finding.path.startswith(PACKAGED_DIRS):
            continue
        if finding.path in hashes:
            files[finding.path] = hashes[finding.path]
        elif finding.path in targets:
            links[finding.path] = targets[finding.path]
    return Candidates(files, links)


def without_proven(findings: Iterable[Finding], proven_paths: frozenset[str]) -> tuple[Finding, ...]:
    return tuple(f for f in findings if not (f.kind in PROVABLE and f.path in proven_paths))


def release_hashes(signed: bytes) -> frozenset[str]:
    """The SHA-256 hashes a release file's signed text lists (its ``SHA256:`` field: ``hash size name`` lines)."""
    hashes: set[str] = set()
    inside = False
    for line in signed.decode("utf-8", "replace").splitlines():
        if not line.startswith((" ", "\t")):
            inside = line.rstrip() == "SHA256:"
            continue
        parts = line.split()
        if inside and len(parts) == 3 and len(parts[0]) == 64:
            hashes.add(parts[0].lower())
    return frozenset(hashes)


@dataclass(frozen=True)
class Member:
    """A file of a package archive's data: its hash, or where it links."""

    sha256: str | None = None
    link: str | None = None


def canonical(path: str, merged: Iterable[str]) -> str:
    """``path`` with a root folder that leads into /usr (``/bin/x`` on a merged system) spelled as /usr's."""
    for name in merged:
        if path.startswith(f"/{name}/"):
            return "/usr" + path
    return path


def deb_members(
    data: bytes, wanted: frozenset[str], merged: Iterable[str] = (), unzstd: Unzstd | None = None
) -> dict[str, Member]:
    """The members of a package archive's data (``ar`` holding ``data.tar.*``) by canonical path: links all, files
    only where ``wanted`` (with their hashes). Empty if it is not an archive this can read (a zstd one without
    ``unzstd``, a corrupt or truncated one: ``UNREADABLE``)."""
    merged = tuple(merged)
    members: dict[str, Member] = {}
    try:
        payload = _data_tar(data, unzstd)
        if payload is None:
            return {}
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                path = canonical(posixpath.normpath("/" + name), merged)
                if info.issym():
                    members[path] = Member(link=info.linkname)
                elif (info.isfile() or info.islnk()) and path in wanted:
                    handle = tar.extractfile(info)
                    if handle is not None:
                        members[path] = Member(sha256=hashlib.sha256(handle.read()).hexdigest())
    except UNREADABLE:
        return {}
    return members


def _data_tar(data: bytes, unzstd: Unzstd | None) -> bytes | None:
    """The data tar of an ``ar`` package archive, decompressed where Python cannot (zstd, through ``unzstd``)."""
    if not data.startswith(AR_MAGIC):
        return None
    offset = len(AR_MAGIC)
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            return None
        if size < 0:  # a negative size would walk back (-60: forever)
            return None
        body = data[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            if not name.endswith(".zst"):
                return body
            return unzstd(body) if unzstd is not None else None
    return None


def _resolve(members: Mapping[str, Member], path: str, merged: Iterable[str]) -> str | None:
    """Where the archive's link at ``path`` leads, through its own links; None if ``path`` is not a link in it."""
    member = members.get(path)
    if member is None or member.link is None:
        return None
    current = path
    for _ in range(MAX_LINK_HOPS):
        member = members.get(current)
        if member is None or member.link is None:
            return current
        base = "/" if member.link.startswith("/") else posixpath.dirname(current)
        current = canonical(posixpath.normpath(posixpath.join(base, member.link)), merged)
    return None


def mirror_prefix(uri: str) -> str | None:
    """How apt names the lists of a source at ``uri`` (scheme and slashes gone: ``deb.debian.org_debian``), for the
    sources the host may fetch from (http and https)."""
    scheme, _, rest = uri.partition("://")
    if scheme not in ("http", "https") or not rest:
        return None
    return rest.split("@")[-1].rstrip("/").replace("/", "_")


def missing_archives(facts: PackageFacts, signed: frozenset[str], mirrors: Iterable[str]) -> dict[str, str]:
    """The archives that signed indices list for the candidates' owners but that the container no longer holds (an
    image whose apt deletes them after each install), by hash: the address on the image's own mirror that the index
    came from (``mirrors``: the image's sources as built, never the container's)."""
    held = {archive.sha256 for archive in facts.archives}
    prefixes = sorted(((mirror_prefix(uri), uri) for uri in mirrors), key=lambda pair: -len(pair[0] or ""))
    wanted: dict[str, str] = {}
    for index in facts.indices:
        if index.sha256 not in signed:
            continue
        name = posixpath.basename(index.path)
        base = next((uri for prefix, uri in prefixes if prefix and name.startswith(prefix + "_")), None)
        if base is None:
            continue
        for digest, filename in index.listed.items():
            if digest not in held and filename and ".." not in filename.split("/"):
                wanted[digest] = base.rstrip("/") + "/" + filename.removeprefix("./")
    return wanted


def proven(
    facts: PackageFacts, signed: frozenset[str], wanted: Candidates, unzstd: Unzstd | None = None
) -> frozenset[str]:
    """The candidates that are a trusted archive's own: ``signed`` holds the hashes that release files signed by a
    key of the image list (``release_hashes`` of what gpgv vouched for); ``unzstd`` opens zstd archives."""
    listed = {digest for index in facts.indices if index.sha256 in signed for digest in index.listed}
    files = {canonical(path, facts.merged): path for path in wanted.files}
    links = {canonical(path, facts.merged): path for path in wanted.links}
    done: set[str] = set()
    for archive in facts.archives:
        if archive.changed and archive.sha256 not in listed:
            continue
        members = deb_members(archive.data, frozenset(files), facts.merged, unzstd)
        for path, original in files.items():
            member = members.get(path)
            if member is not None and member.sha256 == wanted.files[original]:
                done.add(original)
        for path, original in links.items():
            if _resolve(members, path, facts.merged) == canonical(wanted.links[original], facts.merged):
                done.add(original)
    return frozenset(done)
