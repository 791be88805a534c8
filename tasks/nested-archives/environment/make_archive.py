"""Build /data/archive.tar: a tar holding a zip holding a tar.gz holding the invoice (deterministic)."""
import io
import random
import tarfile
import zipfile

rng = random.Random(2031)
invoice = b"%PDF-1.4\n% invoice 2031\n" + bytes(rng.randrange(256) for _ in range(4096)) + b"\n%%EOF\n"
draft = b"%PDF-1.4\n% DRAFT - do not use\n%%EOF\n"


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 1764000000, 0o644
    tar.addfile(info, io.BytesIO(data))


inner = io.BytesIO()
with tarfile.open(fileobj=inner, mode="w:gz") as tar:
    add(tar, "invoices/2031/invoice-2031.pdf", invoice)
    add(tar, "invoices/2030/invoice-2030.pdf", draft.replace(b"DRAFT", b"2030"))

bundle = io.BytesIO()
with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr(zipfile.ZipInfo("records/invoices.tar.gz", (2025, 11, 24, 12, 0, 0)), inner.getvalue())
    z.writestr(zipfile.ZipInfo("records/readme.txt", (2025, 11, 24, 12, 0, 0)), "finance records\n")

with tarfile.open("/data/archive.tar", "w") as tar:
    add(tar, "backup/README.txt", b"Finance backup. Invoices are inside the records bundle.\n")
    add(tar, "backup/drafts/invoice-2031-draft.pdf", draft)
    add(tar, "backup/records-bundle.zip", bundle.getvalue())
