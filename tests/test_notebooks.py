"""The example notebooks: committed without outputs, and each runs top to bottom and draws its plots."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
PLOTS = {"quickstart.ipynb": 0, "evaluation.ipynb": 1, "rl_rollouts.ipynb": 2, "capacity_and_routing.ipynb": 2}
NEEDS_DOCKER = {"quickstart.ipynb", "evaluation.ipynb", "rl_rollouts.ipynb"}


def test_every_notebook_is_listed_and_committed_without_outputs():
    assert {p.name for p in NOTEBOOKS} == set(PLOTS)
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        for cell in book.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} was committed with outputs"


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.docker) if name in NEEDS_DOCKER else name for name in sorted(PLOTS)]
)
def test_notebook_runs_and_shows_its_plots(name):
    book = nbformat.read(EXAMPLES / name, as_version=4)
    NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    images = [
        output
        for cell in book.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == PLOTS[name], f"{name} drew {len(images)} plots"
