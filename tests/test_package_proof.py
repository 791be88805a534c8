"""The package proof's I/O failing (sandbox/package_proof.py), without Docker or a network: whatever cannot be read
keeps the findings (fail closed: what cannot be proved stays the agent's) and never fails the grade.

test_provenance.py holds the proof's rules; test_grade_real_shapes.py plays real archives through the env.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import lzma
import struct
import tarfile
import zlib
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from docker.errors import NotFound

from terminus_env.sandbox import package_proof
from terminus_env.sandbox.package_proof import lift_packaged
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
    chunk = payload[:STORED]
    return (
        header
        + block
        + struct.pack("<I", zlib.crc32(block))
        + b"\x01"
        + struct.pack(">H", len(chunk) - 1)
        + chunk
        + tail
    )


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


def daemon(*archives: bytes) -> Any:
    """The daemon's answer to ``packages``: the image's own archives (unchanged in the container), no index."""

    async def request(op: str, wait: float, **kwargs: Any) -> dict[str, Any]:
        assert (op, kwargs) == ("packages", {"paths": [GPGCONF]})
        held = [{"path": f"/var/cache/apt/archives/gpgconf_{number}_amd64.deb", "changed": False,
                 "data": base64.b64encode(data).decode()} for number, data in enumerate(archives)]  # fmt: skip
        return {"merged": [], "owners": ["gpgconf"], "releases": [], "indices": [], "archives": held}

    return request


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package_proof, "_trust", {})
    monkeypatch.setattr(package_proof, "_fetched", {})


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
