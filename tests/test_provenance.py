"""The proof that code the verifier ran is a Debian package's own (sandbox/provenance.py), without Docker.

Real archives, indices and signatures go through the env in test_grade_real_shapes.py; here each rule of the proof
is held on its own, with the way round it that it must refuse.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import lzma
import os
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from terminus_env.sandbox.inside import packages as inside_packages
from terminus_env.sandbox.package_proof import dearmored, unzstd
from terminus_env.sandbox.provenance import (
    PACKAGED_DIRS,
    Archive,
    Candidates,
    Index,
    PackageFacts,
    candidates,
    deb_members,
    mirror_prefix,
    missing_archives,
    proven,
    release_hashes,
    without_proven,
)
from terminus_env.sandbox.tamper import Finding, Relink, TamperKind, UsedFile, WatchReport

GENUINE = b"\x7fELF the distribution's gpgconf"
TROJAN = b"#!/bin/sh\nprintf 'def test_passes(): pass' > /tests/test_outputs.py\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def deb(files: dict[str, bytes], links: dict[str, str] | None = None, *, zstd: bool = False) -> bytes:
    """A package archive as dpkg-deb makes one: ``ar`` holding debian-binary, control.tar.xz and data.tar.xz (or
    data.tar.zst, as Ubuntu's are)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo("." + path)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for path, target in (links or {}).items():
            info = tarfile.TarInfo("." + path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    if zstd:
        packed = subprocess.run(["zstd", "-c"], input=data.getvalue(), capture_output=True, check=True).stdout
        payload = ("data.tar.zst", packed)
    else:
        payload = ("data.tar.xz", lzma.compress(data.getvalue()))
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", b""), payload]
    out = bytearray(b"!<arch>\n")
    for name, body in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
        out += body + (b"\n" if len(body) % 2 else b"")
    return bytes(out)


def test_the_host_and_the_daemon_agree_on_where_packages_put_code() -> None:
    assert PACKAGED_DIRS == inside_packages.PACKAGED_DIRS


def test_a_release_file_lists_its_sha256_hashes_only() -> None:
    signed = (
        b"Origin: Debian\nMD5Sum:\n 0123456789abcdef0123456789abcdef 10 main/binary-amd64/Packages\n"
        b"SHA256:\n " + b"a" * 64 + b" 2173 main/binary-amd64/Packages\n " + b"b" * 64 + b" 38 Release\n"
        b"SHA512:\n " + b"c" * 128 + b" 2173 Packages\n"
    )
    assert release_hashes(signed) == {"a" * 64, "b" * 64}


def test_an_archives_members_are_read_by_path_with_their_hashes_and_links() -> None:
    archive = deb({"/usr/bin/gpgconf": GENUINE, "/usr/share/doc/x": b"doc"}, {"/bin/gpgconf-link": "gpgconf"})
    members = deb_members(archive, frozenset({"/usr/bin/gpgconf"}), merged=("bin",))
    assert members["/usr/bin/gpgconf"].sha256 == sha(GENUINE)
    assert "/usr/share/doc/x" not in members  # not asked for: never hashed
    assert members["/usr/bin/gpgconf-link"].link == "gpgconf"  # /bin leads into /usr here
    assert deb_members(b"not an archive", frozenset({"/usr/bin/gpgconf"})) == {}


def facts(archive: bytes, *, changed: bool, index_hash: str = "", listed: frozenset[str] = frozenset()) -> PackageFacts:
    indices = (Index("/var/lib/apt/lists/x_Packages", index_hash, listed),) if index_hash else ()
    archives = (Archive("/var/cache/apt/archives/gpgconf.deb", changed, archive),)
    return PackageFacts(("bin", "lib"), (), indices, archives)


WANT_GPGCONF = Candidates({"/usr/bin/gpgconf": sha(GENUINE)}, {})


def test_the_images_own_archive_proves_its_files() -> None:
    assert proven(facts(deb({"/usr/bin/gpgconf": GENUINE}), changed=False), frozenset(), WANT_GPGCONF) == {
        "/usr/bin/gpgconf"
    }


def test_a_new_archive_proves_its_files_only_through_a_signed_index_that_lists_it() -> None:
    archive = deb({"/usr/bin/gpgconf": GENUINE})
    index = "d" * 64
    listed = facts(archive, changed=True, index_hash=index, listed=frozenset({sha(archive)}))
    assert proven(listed, frozenset({index}), WANT_GPGCONF) == {"/usr/bin/gpgconf"}
    # The index is not one a signed release file lists (the agent wrote it, or changed it): no proof.
    assert proven(listed, frozenset({"e" * 64}), WANT_GPGCONF) == frozenset()
    # A signed index that does not list this archive (the agent built it): no proof.
    other = facts(archive, changed=True, index_hash=index, listed=frozenset({"f" * 64}))
    assert proven(other, frozenset({index}), WANT_GPGCONF) == frozenset()


def test_a_file_whose_bytes_are_not_the_members_is_not_proved_by_the_genuine_archive() -> None:
    """The genuine package is there, but the file the verifier ran is the trojan in its place."""
    wanted = Candidates({"/usr/bin/gpgconf": sha(TROJAN)}, {})
    assert proven(facts(deb({"/usr/bin/gpgconf": GENUINE}), changed=False), frozenset(), wanted) == frozenset()


def test_a_zstd_archive_is_read_through_the_decompressor_the_caller_lends() -> None:
    """Ubuntu's archives hold data.tar.zst, which Python's tarfile cannot open: without the host's zstd there is no
    proof (fail closed), with it the genuine file is proved and the trojan still is not."""
    archive = facts(deb({"/usr/bin/gpgconf": GENUINE}, zstd=True), changed=False)
    assert proven(archive, frozenset(), WANT_GPGCONF) == frozenset()
    assert proven(archive, frozenset(), WANT_GPGCONF, unzstd) == {"/usr/bin/gpgconf"}
    assert proven(archive, frozenset(), Candidates({"/usr/bin/gpgconf": sha(TROJAN)}, {}), unzstd) == frozenset()
    assert unzstd(b"not a zstd stream") is None


def test_genuine_bytes_prove_only_the_members_own_path() -> None:
    """A package's program copied to another name (where a tool runs it) is not that package's file there."""
    wanted = Candidates({"/usr/bin/zstd": sha(GENUINE)}, {})
    assert proven(facts(deb({"/usr/bin/gpgconf": GENUINE}), changed=False), frozenset(), wanted) == frozenset()


def test_a_link_is_proved_where_the_archives_link_leads_to_the_same_place() -> None:
    archive = deb(
        {"/usr/lib/x86_64-linux-gnu/libassuan.so.0.8.5": GENUINE},
        {"/usr/lib/x86_64-linux-gnu/libassuan.so.0": "libassuan.so.0.8.5", "/lib/x86_64-linux-gnu/libz.so.1": "x"},
    )
    real = "/usr/lib/x86_64-linux-gnu/libassuan.so.0.8.5"
    honest = Candidates({}, {"/usr/lib/x86_64-linux-gnu/libassuan.so.0": real})
    assert proven(facts(archive, changed=False), frozenset(), honest) == {"/usr/lib/x86_64-linux-gnu/libassuan.so.0"}
    elsewhere = Candidates({}, {"/usr/lib/x86_64-linux-gnu/libassuan.so.0": "/tmp/trojan.so"})
    assert proven(facts(archive, changed=False), frozenset(), elsewhere) == frozenset()


def test_only_the_findings_a_proof_can_lift_ask_for_one() -> None:
    report = WatchReport(
        used=(UsedFile("/usr/bin/gpgconf", True, sha256=sha(GENUINE)), UsedFile("/usr/local/bin/tool", True,
              sha256="0" * 64), UsedFile("/usr/bin/unhashed", True)),
        links=(Relink("/usr/lib/libx.so.1", "/usr/lib/libx.so.1.2"),),
    )  # fmt: skip
    findings = (
        Finding(TamperKind.LOADED_BEFORE_TESTS, "/usr/bin/gpgconf", ""),
        Finding(TamperKind.SHADOWED, "/usr/bin/gpgconf", ""),  # by place: a package's file may shadow too
        Finding(TamperKind.LOADED_BEFORE_TESTS, "/usr/local/bin/tool", ""),  # packages never put code here
        Finding(TamperKind.RUNTIME_MODIFIED, "/usr/bin/unhashed", ""),  # no hash as loaded: nothing to prove
        Finding(TamperKind.LOADED_BEFORE_TESTS, "/usr/lib/libx.so.1", ""),
    )
    wanted = candidates(findings, report)
    assert wanted == Candidates({"/usr/bin/gpgconf": sha(GENUINE)}, {"/usr/lib/libx.so.1": "/usr/lib/libx.so.1.2"})
    kept = without_proven(findings, frozenset(wanted.paths))
    assert [(f.kind, f.path) for f in kept] == [
        (TamperKind.SHADOWED, "/usr/bin/gpgconf"),
        (TamperKind.LOADED_BEFORE_TESTS, "/usr/local/bin/tool"),
        (TamperKind.RUNTIME_MODIFIED, "/usr/bin/unhashed"),
    ]


def test_an_armored_key_is_unwrapped_for_gpgv() -> None:
    key = bytes(range(256)) * 3
    body = base64.b64encode(key).decode()
    armored = "\n".join(
        ["-----BEGIN PGP PUBLIC KEY BLOCK-----", "Comment: a key", ""]
        + [body[i : i + 64] for i in range(0, len(body), 64)]
        + ["=abcd", "-----END PGP PUBLIC KEY BLOCK-----", ""]
    )
    assert dearmored(armored.encode()) == [key]


def test_an_index_kept_whole_or_gzipped_lists_the_owners_archives_hashed_as_stored(tmp_path: Path) -> None:
    text = (b"Package: jq\nVersion: 1.6-2.1\nFilename: pool/main/j/jq/jq_1.6-2.1_amd64.deb\nSHA256: " + b"a" * 64
            + b"\n\nPackage: other\nFilename: pool/o.deb\nSHA256: " + b"b" * 64 + b"\n")  # fmt: skip
    for name, stored in (("x_Packages", text), ("x_Packages.gz", gzip.compress(text))):
        (tmp_path / name).write_bytes(stored)
        index = inside_packages._index(str(tmp_path / name), {"jq"})
        assert index["sha256"] == sha(stored)  # what a release file lists: the file as apt keeps it
        assert index["listed"] == [["a" * 64, "pool/main/j/jq/jq_1.6-2.1_amd64.deb"]]


def test_an_archive_the_container_lost_is_looked_for_on_the_images_own_mirror_only() -> None:
    signed_index = "d" * 64
    lists = "/var/lib/apt/lists/"
    facts = PackageFacts(indices=(
        Index(lists + "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages", signed_index,
              {"a" * 64: "pool/main/j/jq/jq_1.6_amd64.deb"}),
        Index(lists + "deb.debian.org_debian-security_dists_bookworm-security_main_binary-amd64_Packages",
              signed_index, {"b" * 64: "pool/updates/main/x.deb"}),
        Index(lists + "evil.example_dists_x_main_binary-amd64_Packages", signed_index, {"c" * 64: "pool/e.deb"}),
        Index(lists + "deb.debian.org_debian_dists_trixie_main_binary-amd64_Packages", "e" * 64,
              {"f" * 64: "pool/unsigned.deb"}),
    ))  # fmt: skip
    mirrors = ("http://deb.debian.org/debian", "https://deb.debian.org/debian-security/", "file:/opt/repo")
    assert missing_archives(facts, frozenset({signed_index}), mirrors) == {
        "a" * 64: "http://deb.debian.org/debian/pool/main/j/jq/jq_1.6_amd64.deb",
        "b" * 64: "https://deb.debian.org/debian-security/pool/updates/main/x.deb",
    }  # not a source the image names, nor an index no signature covers
    assert mirror_prefix("http://user@deb.debian.org/debian/") == "deb.debian.org_debian"
    assert mirror_prefix("file:/opt/repo") is None


class _Daemon:
    since = time.time() + 3600.0
    """Every file here is older than the container: the image's own, unchanged, as far as the walk can tell."""


SWAPS = {
    "renamed-over": lambda path, crafted: os.replace(crafted, path),
    "link": lambda path, crafted: (path.unlink(), path.symlink_to(crafted)),
    "written-in-place": lambda path, crafted: path.write_bytes(crafted.read_bytes()),
    "fifo": lambda path, crafted: (path.unlink(), os.mkfifo(path)),
}


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_an_archive_swapped_right_after_the_daemon_checked_it_is_never_read_as_the_images_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """The host trusts an unchanged archive without a signature. A process of the agent's, still running while the
    daemon walks for archives, swaps its own archive (or a link to it, or a FIFO) in at the image's archive's path
    the moment the daemon has looked at it. Whatever the daemon then reads must be what it checked: the image's bytes,
    or bytes it says changed."""
    genuine, crafted = deb({"/usr/bin/gpgconf": GENUINE}), deb({"/usr/bin/gpgconf": TROJAN})
    path = tmp_path / "archives" / "gpgconf_2.2.40-1.1_amd64.deb"
    path.parent.mkdir()
    path.write_bytes(genuine)
    os.utime(path, (1e9, 1e9))  # as old as an image's file: a write now shows
    (tmp_path / "crafted.deb").write_bytes(crafted)
    swapped: list[str] = []
    real_lstat, real_fstat = os.lstat, os.fstat

    def checked(info: os.stat_result) -> os.stat_result:
        """The swap, done as soon as the daemon has its answer about the archive (by name or by descriptor)."""
        if not swapped:
            swapped.append(swap)
            SWAPS[swap](path, tmp_path / "crafted.deb")
        return info

    def lstat(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        info = real_lstat(name, *args, **kwargs)
        return checked(info) if os.fspath(name) == str(path) else info

    def fstat(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        return checked(info) if os.readlink(f"/proc/self/fd/{fd}") == str(path) else info

    monkeypatch.setattr(os, "walk", lambda top, *args, **kwargs: iter([(str(path.parent), [], [path.name])]))
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "fstat", fstat)
    found = inside_packages._archives(_Daemon(), {"gpgconf"})
    monkeypatch.undo()
    assert swapped == [swap]
    trusted = [item for item in found if not item["changed"]]
    assert all(base64.b64decode(item["data"]) == genuine for item in trusted), f"{swap}: the agent's archive passed"
    facts = PackageFacts(archives=tuple(Archive(i["path"], i["changed"], base64.b64decode(i["data"])) for i in found))
    assert proven(facts, frozenset(), Candidates({"/usr/bin/gpgconf": sha(TROJAN)}, {})) == frozenset()


def test_the_images_own_archive_left_alone_is_read_as_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swaps' counterpart: with nothing swapped, the image's archive still proves its files without a signature."""
    genuine = deb({"/usr/bin/gpgconf": GENUINE})
    path = tmp_path / "gpgconf_2.2.40-1.1_amd64.deb"
    path.write_bytes(genuine)
    (tmp_path / "gpgconf_link_amd64.deb").symlink_to(path)  # a link is never followed, even to the image's own
    monkeypatch.setattr(
        os, "walk", lambda top, *args, **kwargs: iter([(str(tmp_path), [], sorted(os.listdir(tmp_path)))])
    )
    found = inside_packages._archives(_Daemon(), {"gpgconf"})
    monkeypatch.undo()
    assert [(item["path"], item["changed"], base64.b64decode(item["data"])) for item in found] == [
        (str(path), False, genuine)
    ]
