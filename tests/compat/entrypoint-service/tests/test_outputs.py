import urllib.error
import urllib.request
from pathlib import Path

SERVICE = "http://inventory.internal:8080"


def test_the_release_is_recorded_in_the_service():
    with urllib.request.urlopen(f"{SERVICE}/kv/release", timeout=5) as response:
        assert response.read().decode().strip() == "4.2"


def test_out_of_stock_count():
    assert Path("/app/out_of_stock.txt").read_text().strip() == "3"
