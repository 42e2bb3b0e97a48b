"""The course as students meet it: `make lab`, a real Chromium, notebooks run from the menu.

Screenshots are saved under artifacts/ui/. Needs Debian's chromium and the
playwright package (both installed by .ci/run; playwright comes with the test
extra). Without a browser the test is skipped locally, and fails under CI.
"""

import os
from pathlib import Path

import pytest

from lab_driver import CHROMIUM, CHROMIUM_ARGS, Lab, error_outputs, open_notebook, run_all_cells

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "ui"

pytestmark = pytest.mark.ui

if not os.path.exists(CHROMIUM):
    message = f"no Chromium at {CHROMIUM}: install Debian's chromium package (as .ci/run does)"
    if os.environ.get("CI"):
        raise RuntimeError(message)
    pytest.skip(message, allow_module_level=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab(ROOT, tmp_path_factory.mktemp("lab"))
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    yield page
    context.close()


def shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


def test_setup_notebook_runs_top_to_bottom_in_the_browser(lab, page):
    open_notebook(page, lab, "notebooks/00_setup.ipynb")
    run_all_cells(page)
    shoot(page, "00_setup")
    assert error_outputs(page) == []
    outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
    assert any("<CourseCluster 4 engines, started here" in text for text in outputs)
    assert any("[(0, 4), (1, 4), (2, 4), (3, 4)]" in text for text in outputs)
    assert any("<CourseCluster stopped" in text for text in outputs)  # the last cell ran
