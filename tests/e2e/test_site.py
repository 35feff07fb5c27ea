"""The course as a site (``make book``), as a reader opens it: every page in Chromium.

The site is built from the lessons this sweep has just run in JupyterLab (test_jupyterlab.py
saves each run into build/notebooks/, and runs before this file); a lesson with no current run
there is executed first. Each page is then opened from a local web server, as a reader's browser
would: its images load, every link inside the site leads to a page and an anchor that exist, no
output is an error, and no output shows this machine's folders. Each lesson's page holds every
figure its run made, and the search finds a lesson.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag

import nbformat
import pytest
from test_jupyterlab import SCREENSHOTS, browser  # noqa: F401 (a fixture)

from workshop import book

IMAGES = ("image/png", "image/jpeg", "image/svg+xml")
BUILD_SECONDS = book.ROOT / "build" / "book-build.json"  # docs/benchmarks.md quotes it


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def served(folder: Path):
    """The folder over HTTP on 127.0.0.1, as a reader's browser would load it."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def figures_made(executed: Path) -> int:
    """How many images a lesson's run drew."""
    cells = nbformat.read(executed, as_version=4).cells
    return sum(1 for cell in cells if cell.cell_type == "code" for output in cell.outputs
               if any(kind in output.get("data", {}) for kind in IMAGES))


@pytest.fixture(scope="module")
def site() -> Path:
    started = time.monotonic()
    book.build()
    BUILD_SECONDS.write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
    return book.SITE


@pytest.mark.sweep
@pytest.mark.timeout(3600)  # a lesson no run saved is executed first
def test_every_page_has_its_figures_and_links_and_no_error(browser, site):  # noqa: F811
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if not {"_static", "_sources"} & set(p.parts))
    lessons = [f"notebooks/{course.stem}.html" for course in sorted(book.NOTEBOOKS.glob(
        "[0-9][0-9]_*.ipynb"))]
    assert set(lessons) <= set(pages) and "index.html" in pages, pages
    private = [str(book.ROOT), f"{Path.home()}/"]
    ids: dict[str, set[str]] = {}
    links: list[tuple[str, str]] = []
    with served(site) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            for name in pages:
                page.goto(f"{url}/{name}", wait_until="load")
                broken = page.evaluate("""() => [...document.images]
                    .filter(i => !i.complete || i.naturalWidth === 0)
                    .map(i => i.getAttribute('src'))""")
                assert broken == [], f"{name}: images that do not load: {broken}"
                errors = page.evaluate("""() => [...document.querySelectorAll(
                        '.cell_output .output.traceback, .cell_output .output.error')]
                    .filter(e => !e.closest('.tag_raises-exception'))
                    .map(e => e.innerText.slice(0, 300))""")
                assert errors == [], f"{name}: error outputs: {errors}"
                html = page.content()
                for folder in private:
                    assert folder not in html, f"{name} shows this machine's {folder}"
                ids[name] = set(page.evaluate(
                    "() => [...document.querySelectorAll('[id]')].map(e => e.id)"))
                links += [(name, href) for href in page.evaluate(
                    "() => [...document.querySelectorAll('a[href]')].map(a => a.href)")]
                if name in lessons:
                    shown = page.locator(".cell_output img").count()
                    made = figures_made(book.EXECUTED / Path(name).with_suffix(".ipynb").name)
                    assert shown == made, f"{name}: {shown} figures shown, its run made {made}"
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.goto(f"{url}/notebooks/05_ddp.html", wait_until="load")
            page.screenshot(path=str(SCREENSHOTS / "site-05_ddp.png"))

            page.goto(f"{url}/search.html?q=DistributedSampler", wait_until="load")
            found = page.locator("#search-results li a")
            found.first.wait_for(timeout=30_000)
            assert any("05_ddp" in (found.nth(i).get_attribute("href") or "")
                       for i in range(found.count())), "the search finds lesson 05"
        finally:
            page.close()

        for name, href in links:
            if not href.startswith(url + "/"):
                continue  # outside the site: the theme's links, and the web
            target, anchor = urldefrag(href[len(url) + 1:])
            target = unquote(target.split("?", 1)[0]) or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not target.endswith(".html"):
                assert (site / target).is_file(), f"{name} links to {target}, which is missing"
                continue
            assert target in ids, f"{name} links to {target}, which is missing"
            assert not anchor or anchor in ids[target], (
                f"{name} links to {target}#{anchor}: no such anchor")
