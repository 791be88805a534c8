"""The `golden` fixture: `golden("name")` is the text of golden/name beside the test file."""

from pathlib import Path

import pytest


@pytest.fixture
def golden(request):
    folder = Path(request.node.fspath).parent / "golden"

    def read(name: str) -> str:
        return (folder / name).read_text()

    return read
