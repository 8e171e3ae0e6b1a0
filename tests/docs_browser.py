"""A headless Chromium driven over the DevTools protocol through a pipe, with the standard library only.

``chromium --remote-debugging-pipe`` reads protocol commands from file descriptor 3 and writes replies and events
to descriptor 4, each a JSON object ended by a NUL byte: no websocket client, no port, no driver package. Used by
``tests/test_docs_site.py`` (pages load without a JavaScript error, navigation and search work) and by
``python tests/docs_browser.py SITE OUT`` (screenshots of the built site).
"""

from __future__ import annotations

import base64
import fcntl
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--remote-debugging-pipe", "--window-size=1280,900")


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium; ``page()`` opens a tab that records JavaScript errors and console errors."""

    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The browser's fd 3 reads our commands, its fd 4 writes our replies. bash puts the pipe ends there (no
        # preexec_fn: unsafe while the test's HTTP server thread runs; and not sh: dash takes no fd above 9),
        # after they were moved to fds >= 10, so that neither redirection overwrites the other.
        reader, writer = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w))
        for fd in (to_browser_r, from_browser_w):
            os.close(fd)
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$@" 3<&{reader} 4>&{writer} {reader}<&- {writer}>&-', "bash", executable,
             *FLAGS, f"--user-data-dir={_profile_dir()}", "about:blank"],
            pass_fds=(reader, writer), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(reader)
        os.close(writer)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile go to ``self.events``)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str, deadline_s: float | None = None) -> dict[str, Any]:
        """The next event ``method`` of ``session`` (already received or still to come)."""
        deadline = time.monotonic() + (deadline_s or self.timeout)
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def _read(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium sent nothing for {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed its pipe (exit code {self.process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain, session=session)
        return Page(self, session)


class Page:
    """A tab: ``goto`` loads a URL and waits for its load event; ``errors()`` lists what went wrong in it."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def goto(self, url: str) -> int | None:
        """Load ``url``; returns the document's HTTP status."""
        self.browser.send("Page.navigate", {"url": url}, session=self.session)
        self.browser.wait_for("Page.loadEventFired", self.session)
        status = self.evaluate("performance.getEntriesByType('navigation')[0]?.responseStatus ?? null")
        return None if status is None else int(status)

    def evaluate(self, expression: str) -> Any:
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout: float = 15.0) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout:.0f} s")
            time.sleep(0.1)

    def errors(self) -> list[str]:
        """Uncaught JavaScript exceptions, console errors and failed loads recorded in this tab so far."""
        found = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                          for a in params.get("args", [])))
            elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                found.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        return found

    def screenshot(self, path: Path) -> None:
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"]
        path.write_bytes(base64.b64decode(data))


@functools.cache
def _profile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="ember-docs-chromium-")


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on a free port of 127.0.0.1 for the block; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        pass


@contextmanager
def browser(executable: str) -> Iterator[Browser]:
    opened = Browser(executable)
    try:
        yield opened
    finally:
        opened.close()


def search(page: Page, query: str) -> list[str]:
    """Type ``query`` into Material's search box and return the result titles it lists."""
    page.evaluate("document.querySelector('label[for=\"__search\"]').click()")
    page.evaluate(f"""(() => {{
        const input = document.querySelector('input[data-md-component="search-query"]');
        input.focus(); input.value = {json.dumps(query)};
        input.dispatchEvent(new Event('input', {{bubbles: true}}));
        input.dispatchEvent(new KeyboardEvent('keyup', {{bubbles: true, key: 'e'}}));
    }})()""")
    page.wait_until("document.querySelectorAll('.md-search-result__item').length > 0")
    return page.evaluate("[...document.querySelectorAll('.md-search-result__item h1, .md-search-result__item h2')]"
                         ".map(e => e.textContent.trim())")


def main(site: Path, out: Path) -> None:
    """Screenshots of the home page, a guide and an API page, plus a search, into ``out``."""
    executable = find_chromium()
    if executable is None:
        raise SystemExit("no Chromium on PATH: apt-get install chromium")
    out.mkdir(parents=True, exist_ok=True)
    with serve(site) as base, browser(executable) as chromium:
        page = chromium.page()
        for name, path in (("home", ""), ("guide", "guides/big-models/"), ("api", "api/engine/#engine.ParallelismConfig")):
            status = page.goto(base + path)
            page.screenshot(out / f"{name}.png")
            print(f"{name}: {base + path} -> HTTP {status}, errors: {page.errors()}")
        titles = search(page, "tp_plan")
        page.screenshot(out / "search.png")
        print(f"search 'tp_plan': {titles[:5]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
