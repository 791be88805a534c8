import hashlib
from pathlib import Path


def test_invoice_extracted_intact():
    data = Path("/app/invoice-2031.pdf").read_bytes()
    assert len(data) == 4127
    assert hashlib.sha256(data).hexdigest() == "ce27a31e4f5eced885ebb188e8621e9241191ebe3df1e8f72c65da4f52a38308"
