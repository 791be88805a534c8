"""The I/O around ``provenance.py``: the daemon's facts, the image's keyrings and sources as built, gpgv's check,
and the archives the container no longer holds, fetched from the image's own mirror (checked by their signed hash).

Anything that fails here keeps the findings as they are (fail closed): a proof the host cannot finish is no proof.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import http.client
import io
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException, NotFound

from terminus_env.sandbox.errors import SandboxError
from terminus_env.sandbox.owner import Owner, new_run_id
from terminus_env.sandbox.provenance import (
    Archive,
    PackageFacts,
    candidates,
    missing_archives,
    proven,
    release_hashes,
    without_proven,
)
from terminus_env.sandbox.tamper import Finding, WatchReport

__all__ = [
    "KEYRING_PLACES", "SOURCE_PLACES", "ImageTrust", "dearmored", "fetch_archives", "image_trust", "lift_packaged",
    "signed_text", "unzstd",
]  # fmt: skip

KEYRING_PLACES = ("/etc/apt/trusted.gpg", "/etc/apt/trusted.gpg.d", "/etc/apt/keyrings", "/usr/share/keyrings")
"""Where apt finds the keys it trusts (a source's ``signed-by`` names a file in one of the last two)."""
SOURCE_PLACES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")
FETCH_TOTAL_S = 60.0
"""How long one grading waits on the image's mirrors, all its archives together: what is not fetched by then stays
unproved (its findings stand)."""
FETCH_STALL_S = 20.0
"""How long one connection or read waits on a mirror: a fetch ends at most this long after FETCH_TOTAL_S."""
MIRROR_DOWN_S = 600.0
"""A mirror that did not answer, or not in time, is not asked again for this long by any grading of this process."""
MAX_FETCHED = 16
"""Archives fetched for one grading at most (each owner of a candidate has one or two: its suite and its updates)."""
MAX_FETCHED_BYTES = 256 << 20
MAX_KEPT_BYTES = 256 << 20
"""Fetched archives are kept in memory, by hash, up to this much: the next episode's grading needs the same ones."""
PACKAGES_WAIT_S = 120.0
"""How long the daemon may take to gather the facts (it walks the file system for the archives)."""
GPGV_WAIT_S = 60.0
MAX_KEYRING_BYTES = 8 << 20
_log = logging.getLogger(__name__)
_trust: dict[str, ImageTrust] = {}
_trust_lock = threading.Lock()
_fetched: dict[str, bytes] = {}
_fetched_lock = threading.Lock()
_down: dict[str, float] = {}
"""Mirrors (scheme, host and port) that failed, with when (by the fetch's clock)."""
_down_lock = threading.Lock()

Request = Callable[..., Awaitable[dict[str, Any]]]
Clock = Callable[[], float]
Download = Callable[[str, float], "bytes | None"]
"""Fetches an address in at most the seconds given: its bytes, or None where the mirror answered without them; it
raises (``OSError``, ``HTTPException``) where the mirror did not answer, or not in time."""


async def lift_packaged(
    findings: tuple[Finding, ...], report: WatchReport, request: Request, client: docker.DockerClient,
    container_id: str,
) -> tuple[Finding, ...]:  # fmt: skip
    """``findings`` less those on files and links proved a package's own (``provenance.py``); ``request`` asks the
    container's daemon. It never raises (but for cancellation): whatever fails leaves the findings as they are, and
    the grade goes on."""
    wanted = candidates(findings, report)
    if not wanted.paths:
        return findings
    try:
        facts = PackageFacts.from_reply(await request("packages", PACKAGES_WAIT_S, paths=list(wanted.paths)))
        trust = await asyncio.to_thread(_trust_of, client, container_id)
        signed = frozenset().union(*[
            release_hashes(text)
            for text in await asyncio.gather(*(asyncio.to_thread(signed_text, data, trust.keyrings)
                                               for _, data in facts.releases))  # fmt: skip
            if text is not None
        ])  # fmt: skip
        done = await asyncio.to_thread(proven, facts, signed, wanted, unzstd)
        if len(done) < len(wanted.paths):  # archives the container no longer holds, from the image's mirror
            fetched = await asyncio.to_thread(fetch_archives, missing_archives(facts, signed, trust.mirrors))
            if fetched:  # a proof is per archive: only the fetched ones are left to read
                fresh = dataclasses.replace(facts, archives=fetched)
                done |= await asyncio.to_thread(proven, fresh, signed, wanted, unzstd)
    except (SandboxError, DockerException, OSError, KeyError, ValueError):
        return findings
    except Exception as exc:  # anything else (a cut tar of the image's files, an answer no one foresaw): no proof
        _log.warning("the package proof failed, its findings stand: %s: %s", type(exc).__name__, exc)
        return findings
    return without_proven(findings, done)


def unzstd(body: bytes) -> bytes | None:
    """A zstd stream decompressed by the host's ``zstd`` (Ubuntu's package archives hold one); None without it."""
    program = shutil.which("zstd")
    if program is None:
        return None
    done = subprocess.run([program, "-dc"], input=body, capture_output=True, check=False)
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class ImageTrust:
    """What the image, as built, says apt may trust: its keys (binary) and its sources' addresses."""

    keyrings: tuple[bytes, ...] = ()
    mirrors: tuple[str, ...] = ()


def _trust_of(client: docker.DockerClient, container_id: str) -> ImageTrust:
    return image_trust(client, client.api.inspect_container(container_id)["Image"])


def image_trust(client: docker.DockerClient, image: str) -> ImageTrust:
    """The keys and sources of apt in ``image`` as it was built (read from a container made from it and never
    started, so nothing a sandbox's agent did can change them); cached by image."""
    with _trust_lock:
        if image in _trust:
            return _trust[image]
    container = client.api.create_container(image, command=["true"], network_disabled=True,
                                            labels=Owner.current().labels(new_run_id()))  # fmt: skip
    try:
        keys: list[bytes] = []
        for place in KEYRING_PLACES:
            keys.extend(_key_files(_archive(client, container["Id"], place)))
        mirrors: list[str] = []
        for place in SOURCE_PLACES:
            mirrors.extend(_source_uris(_archive(client, container["Id"], place)))
    finally:
        client.api.remove_container(container["Id"], force=True)
    trust = ImageTrust(tuple(keys), tuple(dict.fromkeys(mirrors)))
    with _trust_lock:
        _trust[image] = trust
    return trust


def _archive(client: docker.DockerClient, container: str, place: str) -> bytes:
    try:
        stream, _ = client.api.get_archive(container, place)
    except NotFound:
        return b""
    return b"".join(stream)


def _files(archive: bytes) -> list[tuple[str, bytes]]:
    """The regular files of a tar (small ones only), by name."""
    if not archive:
        return []
    found: list[tuple[str, bytes]] = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for info in tar:
            handle = tar.extractfile(info) if info.isfile() and info.size <= MAX_KEYRING_BYTES else None
            if handle is not None:
                found.append((info.name, handle.read()))
    return found


def _key_files(archive: bytes) -> list[bytes]:
    """The keyrings in a tar of one of apt's key places: ``*.gpg`` as they are, ``*.asc`` unwrapped; Debian's
    keyring of withdrawn keys is left out."""
    keys: list[bytes] = []
    for name, data in _files(archive):
        if "removed" in name:
            continue
        if name.endswith(".asc"):
            keys.extend(dearmored(data))
        elif name.endswith(".gpg"):
            keys.append(data)
    return keys


def _source_uris(archive: bytes) -> list[str]:
    """The addresses of the sources in a tar of one of apt's source places: one-line ``deb [options] URI suite``
    files and deb822 ``.sources`` files (``URIs:``)."""
    uris: list[str] = []
    for name, data in _files(archive):
        for line in data.decode("utf-8", "replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if name.endswith(".sources") and line.lower().startswith("uris:"):
                uris.extend(line.split(":", 1)[1].split())
            elif (name.endswith(".list") or name.endswith("sources.list")) and line.startswith("deb "):
                words = re.sub(r"\[[^\]]*\]", " ", line).split()
                if len(words) >= 2:
                    uris.append(words[1])
    return uris


def fetch_archives(
    addresses: Mapping[str, str], download: Download | None = None, clock: Clock = time.monotonic
) -> tuple[Archive, ...]:
    """The archives at ``addresses`` (hash: address) whose bytes have that hash: at most MAX_FETCHED, all within
    FETCH_TOTAL_S, none from a mirror that failed in the last MIRROR_DOWN_S. The grading waits on this: without a
    total, 16 archives from a mirror that never answers held it 16 minutes, and every grading after it again."""
    end = clock() + FETCH_TOTAL_S
    fetched = []
    for digest, address in list(addresses.items())[:MAX_FETCHED]:
        with _fetched_lock:
            data = _fetched.get(digest)
        if data is None:
            data = _fetch(address, digest, download or _download, clock, end)
        if data is not None:
            fetched.append(Archive(address, True, data))
    return tuple(fetched)


def _fetch(address: str, digest: str, download: Download, clock: Clock, end: float) -> bytes | None:
    mirror = _mirror(address)
    now = clock()
    with _down_lock:
        failed = _down.get(mirror)
    if now >= end or (failed is not None and now - failed < MIRROR_DOWN_S):
        return None
    try:
        data = download(address, end - now)
    except (OSError, http.client.HTTPException):
        with _down_lock:
            _down[mirror] = clock()
        return None
    if data is None or len(data) > MAX_FETCHED_BYTES or hashlib.sha256(data).hexdigest() != digest:
        return None
    with _fetched_lock:
        _fetched[digest] = data
        while sum(len(kept) for kept in _fetched.values()) > MAX_KEPT_BYTES and len(_fetched) > 1:
            _fetched.pop(next(iter(_fetched)))
    return data


def _mirror(address: str) -> str:
    parts = urllib.parse.urlsplit(address)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2].lower()}"


def _download(address: str, timeout: float, clock: Clock = time.monotonic) -> bytes | None:
    """``address``'s bytes within ``timeout`` seconds, each wait on the mirror at most FETCH_STALL_S (a mirror that
    sends a byte now and then is cut off too); None where it answered without them (an HTTP error, too large)."""
    end = clock() + timeout
    try:
        answer = urllib.request.urlopen(address, timeout=min(FETCH_STALL_S, timeout))  # noqa: S310 (http(s) only)
    except urllib.error.HTTPError as error:
        error.close()
        return None
    except ValueError:
        return None
    with answer:
        data = bytearray()
        while len(data) <= MAX_FETCHED_BYTES:
            if clock() >= end:
                raise TimeoutError(f"{address}: not fetched in {timeout:.0f} s")
            chunk = answer.read1(1 << 20)  # one read of the socket at most
            if not chunk:
                return bytes(data)
            data += chunk
    return None


def dearmored(text: bytes) -> list[bytes]:
    """The binary key blocks of an ASCII-armored file (gpgv reads binary keyrings only)."""
    blocks: list[bytes] = []
    lines = text.decode("ascii", "replace").splitlines()
    index = 0
    while index < len(lines):
        if not lines[index].startswith("-----BEGIN PGP PUBLIC KEY BLOCK"):
            index += 1
            continue
        index += 1
        while index < len(lines) and lines[index].strip():  # the armor's headers, up to a blank line
            index += 1
        body: list[str] = []
        while index < len(lines) and not lines[index].startswith(("=", "-----END")):
            body.append(lines[index].strip())
            index += 1
        try:
            blocks.append(base64.b64decode("".join(body), validate=True))
        except binascii.Error:
            pass
    return blocks


def signed_text(release: bytes, keyrings: Sequence[bytes]) -> bytes | None:
    """The text of a clear-signed release file, if a key of ``keyrings`` signed it (gpgv says so), else None."""
    program = shutil.which("gpgv")
    if program is None or not keyrings:
        return None
    with tempfile.TemporaryDirectory(prefix="terminus-gpgv-") as home:
        args = [program, "--homedir", home, "--quiet", "--output", "-"]
        for number, key in enumerate(keyrings):
            path = Path(home) / f"key{number}.gpg"
            path.write_bytes(key)
            args += ["--keyring", str(path)]
        signed = Path(home) / "InRelease"
        signed.write_bytes(release)
        try:
            done = subprocess.run([*args, str(signed)], capture_output=True, timeout=GPGV_WAIT_S, check=False)
        except subprocess.TimeoutExpired:
            return None
    return done.stdout if done.returncode == 0 else None
