"""The package proof's I/O failing (sandbox/package_proof.py), without Docker or a network: whatever cannot be read
keeps the findings (fail closed: what cannot be proved stays the agent's) and never fails the grade.

test_provenance.py holds the proof's rules; test_grade_real_shapes.py plays real archives through the env.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import io
import lzma
import struct
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from docker.errors import NotFound

from terminus_env.sandbox import package_proof
from terminus_env.sandbox.package_proof import (
    FETCH_STALL_S,
    FETCH_TOTAL_S,
    MIRROR_DOWN_S,
    ImageTrust,
    fetch_archives,
    lift_packaged,
)
from terminus_env.sandbox.provenance import deb_members
from terminus_env.sandbox.tamper import Finding, TamperKind, UsedFile, WatchReport

GPGCONF = "/usr/bin/gpgconf"
GENUINE = b"\x7fELF the distribution's gpgconf\n" * 4000
"""Larger than one stored chunk of a compressed stream (64 KiB): reading it runs into what follows the chunk."""
FINDINGS = (Finding(TamperKind.LOADED_BEFORE_TESTS, GPGCONF, "the verifier ran it before its tests"),)
REPORT = WatchReport(used=(UsedFile(GPGCONF, True, sha256=hashlib.sha256(GENUINE).hexdigest()),))


def data_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("." + GPGCONF)
        info.size = len(GENUINE)
        tar.addfile(info, io.BytesIO(GENUINE))
    return out.getvalue()


def ar(payload_name: str, payload: bytes, size: str | None = None) -> bytes:
    """A package archive as dpkg-deb lays one out: ``ar`` holding debian-binary, then the data tar."""
    out = bytearray(b"!<arch>\n")
    for name, body in (("debian-binary", b"2.0\n"), (payload_name, payload)):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{size or len(body):<10}`\n".encode()
        out += body + (b"\n" if len(body) % 2 else b"")
    return bytes(out)


STORED = 0xFFFF


def xz_stored(payload: bytes, tail: bytes) -> bytes:
    """An xz stream holding ``payload``'s first 64 KiB verbatim (one uncompressed LZMA2 chunk), then ``tail``: the
    bytes b"\\x03" are no valid chunk (a corrupt stream), none are a stream cut short. Built by hand so that where it
    breaks does not depend on an encoder: after the tar's first header, inside the member's data."""
    flags = b"\x00\x01"  # CRC32 checks
    header = b"\xfd7zXZ\x00" + flags + struct.pack("<I", zlib.crc32(flags))
    block = bytes([2, 0x00, 0x21, 0x01, 0x16, 0, 0, 0])  # 12 bytes with its CRC, no sizes, one filter: LZMA2
    block += struct.pack("<I", zlib.crc32(block))
    chunk = payload[:STORED]
    return header + block + b"\x01" + struct.pack(">H", len(chunk) - 1) + chunk + tail


def gz_stored(payload: bytes, tail: bytes) -> bytes:
    """A gzip stream holding ``payload``'s first 64 KiB in one stored deflate block, then ``tail``: the byte b"\\x07"
    is a block of the reserved type (a corrupt stream), none is a stream cut short."""
    chunk = payload[:STORED]
    stored = b"\x00" + struct.pack("<HH", len(chunk), len(chunk) ^ 0xFFFF) + chunk
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + stored + tail


UNREADABLE = {
    "corrupt-xz": lambda: ar("data.tar.xz", xz_stored(data_tar(), b"\x03")),  # LZMAError
    "truncated-xz": lambda: ar("data.tar.xz", xz_stored(data_tar(), b"")),  # EOFError
    "corrupt-gz": lambda: ar("data.tar.gz", gz_stored(data_tar(), b"\x07")),  # zlib.error
    "truncated-gz": lambda: ar("data.tar.gz", gz_stored(data_tar(), b"")),  # EOFError
    "corrupt-tar": lambda: ar("data.tar", data_tar()[:100] + b"\xff" * 412 + data_tar()[512:]),  # TarError
    "truncated-tar": lambda: ar("data.tar", data_tar()[:4096]),  # TarError
}


WHOLE = ar("data.tar.xz", lzma.compress(data_tar()))
MIRROR = "http://deb.debian.org/debian"
LISTS = "/var/lib/apt/lists/deb.debian.org_debian_"


class FakeApi:
    """The engine's calls the proof makes, with the image's apt folders as ``places`` (a tar each)."""

    def __init__(self, places: Mapping[str, bytes] | None = None) -> None:
        self.places = dict(places or {})
        self.created: list[str] = []
        self.removed: list[str] = []

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"Image": "sha256:the-image"}

    def create_container(self, image: str, **kwargs: Any) -> dict[str, Any]:
        self.created.append(f"made-{len(self.created)}")
        return {"Id": self.created[-1]}

    def get_archive(self, container: str, place: str) -> tuple[Iterable[bytes], dict[str, Any]]:
        if place not in self.places:
            raise NotFound(place)
        return iter([self.places[place]]), {}

    def remove_container(self, container: str, force: bool = False) -> None:
        self.removed.append(container)


def daemon(*archives: bytes, indices: Iterable[dict[str, Any]] = ()) -> Any:
    """The daemon's answer to ``packages``: the image's own archives (unchanged in the container), and ``indices``
    (with a release file for them)."""

    async def request(op: str, wait: float, **kwargs: Any) -> dict[str, Any]:
        assert (op, kwargs) == ("packages", {"paths": [GPGCONF]})
        held = [{"path": f"/var/cache/apt/archives/gpgconf_{number}_amd64.deb", "changed": False,
                 "data": base64.b64encode(data).decode()} for number, data in enumerate(archives)]  # fmt: skip
        releases = [{"path": LISTS + "dists_bookworm_InRelease", "data": ""}] if indices else []
        return {"merged": [], "owners": ["gpgconf"], "releases": releases, "indices": list(indices), "archives": held}

    return request


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package_proof, "_trust", {})
    monkeypatch.setattr(package_proof, "_fetched", {})
    monkeypatch.setattr(package_proof, "_down", {}, raising=False)


def lift(request: Any, api: FakeApi | None = None) -> tuple[Finding, ...]:
    return asyncio.run(lift_packaged(FINDINGS, REPORT, request, SimpleNamespace(api=api or FakeApi()), "sandbox"))


def test_the_images_own_archive_lifts_the_finding() -> None:
    """What the cases below break: a whole archive of the image's proves its member."""
    assert lift(daemon(WHOLE)) == ()


@pytest.mark.parametrize("broken", sorted(UNREADABLE))
def test_an_archive_that_cannot_be_read_keeps_the_findings_and_never_fails_the_grade(broken: str) -> None:
    """The image's own archive, corrupt or cut short (a partial download left in the image, say): reading it raises
    whatever its stream's decompressor raises, which once escaped the grade (``env.step`` raised). It proves nothing,
    the finding stands, and it spoils no other archive's proof."""
    archive = UNREADABLE[broken]()
    assert lift(daemon(archive)) == FINDINGS
    assert lift(daemon(archive, WHOLE)) == ()


def test_the_images_apt_files_cut_short_keep_the_findings_and_leave_no_container() -> None:
    """The tar the engine gives of the image's apt folders (its keys and sources, read from a container that never
    starts) is cut short: no keys, no proof, and the container made to read them is gone."""
    sources = io.BytesIO()
    with tarfile.open(fileobj=sources, mode="w") as tar:
        text = b"deb http://deb.debian.org/debian bookworm main\n" * 100
        info = tarfile.TarInfo("sources.list")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    api = FakeApi({"/etc/apt/sources.list": sources.getvalue()[:1024]})
    assert lift(daemon(WHOLE), api) == FINDINGS
    assert api.created and api.removed == api.created


@pytest.mark.timeout(10)
def test_an_archive_whose_member_has_a_negative_size_is_read_to_its_end() -> None:
    """An ``ar`` header of size -60 sent the reader 0 bytes on, forever, in a thread the grade waited on."""
    assert deb_members(ar("data.tar", data_tar(), size="-60"), frozenset({GPGCONF})) == {}


# --- the archives the container no longer holds, fetched from the image's mirror --------------------------------


class Clock:
    """The fetch's clock, moved on by the fake mirrors: no test waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_fetch_from_the_mirror_waits_one_deadline_for_all_its_archives() -> None:
    """A mirror that answers, slowly: each archive takes 25 s. Sixteen of them once held the grading 400 s (up to
    16 minutes, a minute each); now the fetch stops asking when the time for all of them is up, and no archive is
    given longer than what is left. What it fetched is kept: the next grading asks for the rest."""
    clock, start = Clock(), 1000.0
    served = {f"{MIRROR}/pool/main/p{number}.deb": b"archive %d" % number for number in range(16)}
    asked: list[tuple[float, float]] = []

    def slow(address: str, timeout: float) -> bytes:
        asked.append((clock.now, timeout))
        clock.now += 25.0
        return served[address]

    addresses = {sha(data): address for address, data in served.items()}
    assert len(fetch_archives(addresses, slow, clock)) == len(asked) == 3  # at 0, 25 and 50 s: at 75 s time is up
    assert all(when + timeout <= start + FETCH_TOTAL_S for when, timeout in asked)
    asked.clear()
    assert len(fetch_archives(addresses, slow, clock)) == 6 and len(asked) == 3


def test_a_mirror_that_failed_is_not_asked_again_for_a_while() -> None:
    """A mirror that never answers (a host without a way out, a firewall): one grading waits on it once, then
    neither the rest of its archives nor the gradings that follow wait on it, until MIRROR_DOWN_S has passed. A mirror
    that answers is asked as before, even when it has no such archive."""
    clock = Clock()
    silent, other = f"{MIRROR}/pool/main/", "https://security.example/debian-security/pool/"
    addresses = {sha(b"a%d" % number): f"{silent}a{number}.deb" for number in range(3)}
    addresses |= {sha(b"security"): other + "x.deb", sha(b"removed"): other + "gone.deb"}
    asked: list[str] = []

    def download(address: str, timeout: float) -> bytes | None:
        asked.append(address)
        if address.startswith(silent):
            clock.now += FETCH_STALL_S  # the wait on its connection, then nothing
            raise urllib.error.URLError(TimeoutError("timed out"))
        return b"security" if address.endswith("x.deb") else None  # gone: an HTTP 404

    assert [a.data for a in fetch_archives(addresses, download, clock)] == [b"security"]
    assert asked == [silent + "a0.deb", other + "x.deb", other + "gone.deb"]
    asked.clear()
    clock.now += MIRROR_DOWN_S - 1
    assert [a.data for a in fetch_archives(addresses, download, clock)] == [b"security"]  # kept from before
    assert asked == [other + "gone.deb"]
    asked.clear()
    clock.now += 1
    fetch_archives(addresses, download, clock)
    assert asked == [silent + "a0.deb", other + "gone.deb"]


class Answer(io.BytesIO):
    """A mirror's answer as urlopen gives it."""


@pytest.mark.parametrize("mirror", ["answers", "answers-garbage"])
def test_an_archive_the_container_lost_is_fetched_and_a_mirror_that_fails_keeps_the_findings(
    monkeypatch: pytest.MonkeyPatch, mirror: str
) -> None:
    """The container no longer holds the archive (apt deleted it); a signed index lists it (gpgv's word faked
    here). The mirror hands it over and it proves the file; or the mirror answers what is no HTTP at all, whose
    error (``http.client.HTTPException``, no ``OSError``) once escaped the grade. Then the findings stand, and the
    mirror is not asked again by the next grading."""
    index = "d" * 64
    monkeypatch.setattr(package_proof, "_trust", {"sha256:the-image": ImageTrust((b"key",), (MIRROR,))})
    monkeypatch.setattr(package_proof, "signed_text", lambda data, keys: b"SHA256:\n " + index.encode() + b" 9 P\n")
    opened: list[str] = []

    def urlopen(address: str, timeout: float) -> Answer:
        opened.append(address)
        if mirror == "answers-garbage":
            raise http.client.BadStatusLine("SSH-2.0-OpenSSH_9.2")
        return Answer(WHOLE)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    listed = {"path": LISTS + "dists_bookworm_main_binary-amd64_Packages", "sha256": index,
              "listed": [[sha(WHOLE), "pool/main/g/gnupg2/gpgconf_2.2.40-1.1_amd64.deb"]]}  # fmt: skip
    wanted = [MIRROR + "/pool/main/g/gnupg2/gpgconf_2.2.40-1.1_amd64.deb"]
    expected = FINDINGS if mirror == "answers-garbage" else ()
    assert lift(daemon(indices=[listed])) == expected and opened == wanted
    opened.clear()
    assert lift(daemon(indices=[listed])) == expected and opened == []  # kept, or the mirror remembered


def test_a_mirror_that_sends_a_byte_now_and_then_is_cut_off_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read answers just within the wait on one read: only the deadline of the whole fetch ends it."""
    clock = Clock()

    class Dripping(Answer):
        def read1(self, size: int = -1) -> bytes:
            clock.now += FETCH_STALL_S - 1
            return b"x"

    opened: list[float] = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda address, timeout: opened.append(timeout) or Dripping())
    with pytest.raises(TimeoutError):
        package_proof._download(MIRROR + "/pool/x.deb", 45.0, clock)
    assert opened == [FETCH_STALL_S] and clock.now < 1000.0 + 45.0 + FETCH_STALL_S
