"""PyTorch is the ``torch`` extra: without it, chapter 09 says so in one line and runs to the end."""

import sys

import pytest

from coursekit.course import notebooks as nb
from coursekit.production import requirement

CHAPTER = nb.ROOT / "notebooks" / "src" / "09_production.py"


@pytest.fixture
def no_torch(tmp_path, monkeypatch):
    """A folder whose ``torch`` package fails to import, first on the path of this process
    and of every kernel started from it: an install without the extra."""
    fake = tmp_path / "without-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent}:{nb.ROOT}")
    monkeypatch.syspath_prepend(str(fake.parent))
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    return fake.parent


def test_without_torch_the_library_names_the_extra(no_torch):
    assert not requirement.torch_available()
    with pytest.raises(ModuleNotFoundError, match=r"'torch' extra"):
        requirement.import_torch()


def test_with_torch_nothing_is_skipped():
    pytest.importorskip("torch", reason="the torch extra is not installed")
    assert requirement.torch_available()
    assert requirement.import_torch().__name__ == "torch"


@pytest.mark.slow  # a Jupyter kernel runs the whole chapter
def test_chapter_09_without_torch_prints_one_line_and_runs_to_the_end(no_torch):
    from nbclient import NotebookClient

    notebook = nb.build(CHAPTER)
    NotebookClient(notebook, timeout=60, kernel_name="python3").execute()  # raises on any error
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    texts = ["".join(out.get("text", "") for out in cell.outputs) for cell in code]
    assert [out.output_type for out in code[0].outputs] == ["stream"]
    assert texts[0].strip().endswith("The cells below are skipped."), texts[0]
    assert "'torch' extra" in texts[0] and texts[0].count("\n") == 1, texts[0]
    assert [cell.outputs for cell in code[1:]] == [[] for _ in code[1:]]  # nothing ran, no cluster
