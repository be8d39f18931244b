"""Headless Chromium driven over the DevTools protocol, for the report tests (standard library only).

Chromium is started with ``--remote-debugging-pipe``: it reads protocol messages from file descriptor 3
and writes to 4, each message a JSON object ended by a NUL byte, so no websocket library and no network
port are needed. `Browser.open` loads a page; `Page` evaluates script, takes screenshots and keeps every
console message and uncaught exception of the page. The binary is Debian's ``chromium`` (installed by
.ci/run) or whatever ``CHROMIUM`` names.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Optional[str]:
    """The Chromium binary: ``$CHROMIUM``, else the first of `NAMES` on PATH, else None."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"]) or os.environ["CHROMIUM"]
    return next((path for path in map(shutil.which, NAMES) if path), None)


class ProtocolError(RuntimeError):
    """A DevTools command answered with an error."""


class Browser:
    """One headless Chromium process with a fresh profile; use as a context manager."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout, self.events, self._next_id, self._buffer = timeout, [], 0, b""
        self.profile = tempfile.mkdtemp(prefix="rangeswa-chromium-")
        to_chrome_read, to_chrome_write = os.pipe()
        from_chrome_read, from_chrome_write = os.pipe()

        def wire():  # in the child: the pipe ends on descriptors 3 and 4, inheritable
            ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_read, from_chrome_write)]
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)

        # Chromium's own log goes to a file: a pipe nobody reads could fill and stall it.
        self.log = open(os.path.join(self.profile, "chromium.log"), "w+b")
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        self._write, self._read = to_chrome_write, from_chrome_read

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.call("Browser.close")
            except (ProtocolError, OSError, TimeoutError, EOFError):
                self.process.kill()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are kept in ``events``."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode("utf-8") + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ProtocolError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        """The first event ``method`` of ``session`` not yet consumed (waiting for it when needed)."""
        while True:
            for event in self.events:
                if event["method"] == method and event.get("sessionId") == session:
                    self.events.remove(event)
                    return event
            reply = self._receive()
            if "method" in reply:
                self.events.append(reply)

    def open(self, url: str) -> "Page":
        """A new tab showing ``url``, loaded (its load event fired)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        return page

    def _receive(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"Chromium answered nothing for {self.timeout} s")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                self.log.seek(0)
                error = self.log.read().decode(errors="replace")[-2000:]
                raise EOFError(f"Chromium closed the DevTools pipe (exit {self.process.poll()}): {error}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)


class Page:
    """One tab of a `Browser`."""

    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited); a thrown error raises."""
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (the whole page by default) written to ``path``."""
        params = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = self.browser.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.browser.call("Page.captureScreenshot", params, self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and failed loads the page reported so far."""
        found = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                      for a in params.get("args", [])))
            elif event["method"] == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails', {})}")
            elif event["method"] == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                entry = params["entry"]
                found.append(f"log {entry['level']} ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
        return found
