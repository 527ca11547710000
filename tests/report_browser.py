"""Real-browser checks of the report pages (headless Chromium through chromedriver and
selenium): no JavaScript console error, no broken internal link, the summary, the
galleries and the collapsed tables present, sortable tables that sort, and the annotation
form's download. Used by tests/test_report_browser.py and the demo run in
tests/test_workflow.py."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from conftest import skip_unless_ci

from stereolens.report.browser import FIRST_SCREEN, chromedriver_binary, chromium_binary

# every link and image of a page, with whether it points into the page (#id) or to a file
LINKS_JS = """
const out = [];
for (const a of document.querySelectorAll('a[href]'))
  out.push(['a', a.getAttribute('href'), a.href]);
for (const i of document.querySelectorAll('img[src]'))
  out.push(['img', i.getAttribute('src').slice(0, 64),
            i.src.startsWith('data:') ? 'data:' : i.src]);
return out;
"""


@contextlib.contextmanager
def chromium(download_dir: Path | None = None):
    """A headless Chromium session; skipped (failed under CI) when Chromium or its driver
    is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_unless_ci("selenium is not installed (the dev extra has it)")
    binary, driver_path = chromium_binary(), chromedriver_binary()
    if binary is None or driver_path is None:
        skip_unless_ci("chromium / chromedriver are not installed (apt-get install chromium "
                       "chromium-driver; .ci/run does)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={FIRST_SCREEN[0]},{FIRST_SCREEN[1]}",
                "--allow-file-access-from-files"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if download_dir is not None:
        options.add_experimental_option(
            "prefs", {"download.default_directory": str(download_dir),
                      "download.prompt_for_download": False}
        )  # fmt: skip
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        if download_dir is not None:
            driver.execute_cdp_cmd(
                "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)}
            )
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver, path: Path) -> float:
    """Load ``path``; returns the seconds to the load event."""
    assert path.is_file(), f"{path} does not exist"
    driver.get(path.resolve().as_uri())
    return driver.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return t ? t.loadEventEnd / 1000 : null;"
    )


def broken_links(driver, page: Path) -> list[str]:
    """Links and images of the loaded page that point at nothing: an anchor without its
    element, a file that does not exist, an image that did not decode."""
    broken = []
    for kind, raw, resolved in driver.execute_script(LINKS_JS):
        if resolved == "data:":
            continue
        url = urlparse(resolved)
        if url.scheme != "file":
            broken.append(f"{kind} {raw}: not a local link")
            continue
        target = Path(unquote(url.path))
        if url.fragment and target.resolve() == page.resolve():
            found = driver.execute_script(
                "return document.getElementById(arguments[0]) !== null;", unquote(url.fragment)
            )
            if not found:
                broken.append(f"{kind} {raw}: no element with that id")
        elif not target.exists():
            broken.append(f"{kind} {raw}: {target} does not exist")
    bad_images = driver.execute_script(
        "return Array.from(document.images).filter(i => i.loading !== 'lazy' && i.complete "
        "&& i.naturalWidth === 0).map(i => i.getAttribute('src').slice(0, 80));"
    )
    return broken + [f"img {src}: did not decode" for src in bad_images]


def check_report(driver, index: Path, *, screenshot: bool = True) -> dict:
    """Open index.html and every gallery it links; assert the page works. Returns facts
    about it (load seconds, counts) for the caller's own checks."""
    from selenium.webdriver.common.by import By

    load = open_page(driver, index)
    assert console_errors(driver) == []
    assert broken_links(driver, index) == []
    # the summary comes first: the bias profile table and its figure
    summary = driver.find_element(By.ID, "summary")
    profile_rows = summary.find_elements(By.CSS_SELECTOR, "table.profile tbody tr")
    assert profile_rows, "no bias profile rows"
    assert summary.find_elements(By.CSS_SELECTOR, "figure img")
    assert driver.find_element(By.ID, "contents").location["y"] > summary.location["y"]
    # collapsed tables: closed details that open, with a CSV link and a sortable table
    details = driver.find_elements(By.CSS_SELECTOR, "details[data-table]")
    assert details, "no collapsed table"
    assert all(d.get_attribute("open") is None for d in details)
    first = details[0]
    driver.execute_script("arguments[0].scrollIntoView();", first)
    first.find_element(By.TAG_NAME, "summary").click()
    assert first.get_attribute("open") is not None
    table = first.find_element(By.CSS_SELECTOR, "table.sortable")
    header = table.find_elements(By.CSS_SELECTOR, "thead th")[0]
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    assert console_errors(driver) == []
    # galleries: every linked page opens, without errors or broken links
    galleries = sorted(
        {
            a.get_attribute("href")
            for a in driver.find_elements(By.CSS_SELECTOR, "#galleries a[href]")
        }
    )
    if screenshot:
        driver.execute_script("window.scrollTo(0, 0);")
        time.sleep(0.2)
        driver.save_screenshot(str(index.parent / "first-screen.png"))
    cards = 0
    for href in galleries:
        page = Path(unquote(urlparse(href).path))
        open_page(driver, page)
        assert console_errors(driver) == [], page
        driver.execute_script("window.scrollTo(0, document.body.scrollHeight);")
        time.sleep(0.2)  # lazy thumbnails load once scrolled into view
        assert broken_links(driver, page) == [], page
        cards += len(driver.find_elements(By.CSS_SELECTOR, "figure.card"))
    return {"load_s": load, "profile_rows": len(profile_rows), "galleries": len(galleries),
            "cards": cards, "collapsed": len(details)}  # fmt: skip


def fill_and_save_form(driver, form: Path, download_dir: Path, annotator: str) -> Path:
    """Answer every question of the annotation form (first label, slider to 1) and press
    Save; returns the CSV the browser downloaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(driver, form)
    assert console_errors(driver) == []
    assert broken_links(driver, form) == []
    driver.find_element(By.ID, "annotator").send_keys(annotator)
    for item in driver.find_elements(By.CSS_SELECTOR, "fieldset.item"):
        field = item.find_element(By.CSS_SELECTOR, ".label")
        if field.tag_name == "select":
            Select(field).select_by_index(1)
        else:
            field.send_keys("lab coat")
        slider = item.find_element(By.CSS_SELECTOR, ".prevalence")
        driver.execute_script(
            "arguments[0].value = 1; arguments[0].dispatchEvent(new Event('input'));"
            "arguments[1].dispatchEvent(new Event('change'));",
            slider,
            field,
        )
    driver.find_element(By.ID, "save").click()
    deadline = time.time() + 20
    while time.time() < deadline:
        done = [p for p in download_dir.glob("*.csv") if not p.name.endswith(".crdownload")]
        if done:
            assert console_errors(driver) == []
            return done[0]
        time.sleep(0.2)
    raise AssertionError(f"the form downloaded no CSV into {download_dir}")
