import re
from pathlib import Path

import pytest

GOOD = ["192.168.1.1", "0.0.0.0", "255.255.255.255", "10.0.0.1", "1.22.199.250", "249.100.9.99", "172.16.254.1"]
BAD = [
    "256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.", ".1.2.3.4", "1.2.3.04", "1.2.3.256", "300.300.300.300",
    "1..2.3", "1.2.3.4 ", " 1.2.3.4", "a.b.c.d", "1.2.3.-4", "+1.2.3.4", "1,2,3,4", "1.2.3.4.5",
    "999.1.1.1", "1.2.3.00", "260.0.0.0", "25a.1.1.1", "", "1.2.3.4\n",
]


def pattern():
    lines = Path("/app/ipv4.regex").read_text().splitlines()
    assert len(lines) == 1, "the file must hold exactly one line"
    return re.compile(lines[0])


@pytest.mark.parametrize("text", GOOD)
def test_matches_valid(text):
    assert pattern().fullmatch(text)


@pytest.mark.parametrize("text", BAD)
def test_rejects_invalid(text):
    assert not pattern().fullmatch(text)
