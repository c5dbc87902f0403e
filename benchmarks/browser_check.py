"""The page of tmt-serve in a real browser: start the server on a trained model, open the page in
headless Chromium with a sentence, and keep a screenshot; the page's DOM, read the same way,
must show the translation, the n-best list and the heat map; of a model trained into several
target languages (--tgt-lang), the language menu with the language asked for; with terms in the
glossary box (--glossary), a translation that contains them.

    .venv/bin/python -m benchmarks.browser_check --run runs/demo --output benchmarks/serve_page.png
    .venv/bin/python -m benchmarks.browser_check --run runs/both_ways --tgt-lang de
    .venv/bin/python -m benchmarks.browser_check --run runs/demo --glossary "farmer=Landwirt"

Needs the `serve` extra and Chromium (Debian: apt install chromium). Exits 1 if the page does
not show what it should.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(run: str, port: int) -> subprocess.Popen:
    """tmt-serve on 127.0.0.1:port, once /health answers."""
    server = subprocess.Popen(
        [str(BIN / "tmt-serve"), f"run_dir={run}", f"port={port}", "device=cpu"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"tmt-serve ended: {server.stderr.read()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("tmt-serve did not answer /health within 120 s")


class PageContents(HTMLParser):
    """The text of #translation, the items of #nbest-list, the cells of the heat map, and the
    language menu: whether it is shown, and the language it has selected."""

    def __init__(self):
        super().__init__()
        self.translation, self.alternatives, self.cells = "", 0, 0
        self.inside: str | None = None
        self.menu_shown, self.selected = False, None

    def handle_starttag(self, tag, attrs):
        identity = dict(attrs).get("id")
        if identity == "language-choice":
            self.menu_shown = "hidden" not in dict(attrs)
        if tag == "option" and "selected" in dict(attrs):
            self.inside = "option"
        if identity in ("translation",):
            self.inside = identity
        if tag == "li":
            self.alternatives += 1
        if tag == "td" and "background" in (dict(attrs).get("style") or ""):
            self.cells += 1

    def handle_endtag(self, tag):
        if tag == "div":
            self.inside = None

    def handle_data(self, data):
        if self.inside == "translation":
            self.translation += data
        if self.inside == "option":
            self.selected, self.inside = data.strip(), None


def chromium(browser: str, url: str, *extra: str) -> subprocess.CompletedProcess:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--virtual-time-budget=20000", "--window-size=1100,1000", *extra, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", default="runs/demo", help="a trained run folder")
    parser.add_argument("--text", default="The old farmer has sold his seven black horses.")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/serve_page.png"))
    parser.add_argument("--tgt-lang", help="a model of several target languages: translate into")
    parser.add_argument(
        "--glossary",
        help='term pairs for the glossary box, "source=target|source=target": the translation '
        "shown must contain each target term",
    )
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("no chromium on PATH (Debian: apt install chromium)")
    port = free_port()
    server = start_server(args.run, port)
    try:
        query = {"text": args.text, **({"tgt_lang": args.tgt_lang} if args.tgt_lang else {})}
        if args.glossary:
            query["glossary"] = args.glossary
        url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode(query)
        shot = chromium(browser, url, f"--screenshot={args.output.resolve()}")
        if shot.returncode != 0 or not args.output.is_file():
            raise SystemExit(f"chromium failed: {shot.stderr[-2000:]}")
        page = PageContents()
        page.feed(chromium(browser, url, "--dump-dom").stdout)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"page: {url}")
    print(f"  translation shown: {page.translation.strip()!r}")
    print(f"  n-best entries: {page.alternatives}; heat-map cells: {page.cells}")
    print(f"  screenshot: {args.output}")
    if not (page.translation.strip() not in ("", "…") and page.alternatives and page.cells):
        raise SystemExit("the page does not show a translation, its n-best list and a heat map")
    if args.glossary:
        wanted = [pair.split("=", 1)[1].strip() for pair in args.glossary.split("|")]
        missing = [term for term in wanted if term not in page.translation]
        print(f"  glossary terms {wanted}: missing from the translation: {missing or 'none'}")
        if missing:
            raise SystemExit(f"the translation shown lacks the glossary's terms {missing}")
    if args.tgt_lang:
        print(f"  language menu shown: {page.menu_shown}; selected: {page.selected}")
        if not (page.menu_shown and page.selected == args.tgt_lang):
            raise SystemExit(f"the page does not show the language menu with {args.tgt_lang}")


if __name__ == "__main__":
    main()
