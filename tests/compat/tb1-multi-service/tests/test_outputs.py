import json
import urllib.request
from pathlib import Path

EXPECTED = ["belt-a", "gear-12", "pulley"]


def test_the_ledger_got_one_sorted_reorder():
    with urllib.request.urlopen("http://ledger:7100/reorders", timeout=5) as response:
        assert json.load(response) == [EXPECTED]


def test_the_reorder_file():
    assert Path("/app/reorder.txt").read_text().split() == EXPECTED
