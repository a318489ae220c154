"""Drive headless Chromium over the DevTools protocol, for the view's tests, its benchmark and
the README's screenshots.

Chromium runs with `--remote-debugging-pipe`: it reads protocol commands from its fd 3 and
writes replies and events to its fd 4, one JSON message per NUL-terminated record, so no
websocket library and no port are needed.

    with Browser() as browser:                   # raises BrowserMissing without chromium
        page = browser.open("file:///tmp/step.html", width=1600, height=1000)
        page.evaluate("document.querySelectorAll('.coll-row').length")
        page.click(".coll-line summary")
        page.screenshot("shot.png")
        page.errors                              # uncaught exceptions and console errors
        page.requests                            # every URL the page asked for
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserMissing(RuntimeError):
    """No Chromium on PATH."""


class BrowserError(RuntimeError):
    """The browser answered a command with an error, died, or did not answer in time."""


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, executable: str | None = None, timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserMissing("no Chromium found on PATH (tried " + ", ".join(CANDIDATES) +
                                 "); install it, e.g. `apt-get install chromium`")
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []
        self._profile = tempfile.TemporaryDirectory(prefix="hlo-passes-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # The child's ends get numbers above 4, so that moving them to 3 and 4 clobbers neither.
        cmd_r, out_w = _above_4(cmd_r), _above_4(out_w)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                 "--mute-audio", "--hide-scrollbars", f"--user-data-dir={self._profile.name}",
                 "--remote-debugging-pipe", "about:blank"]
        # Chromium wants the pipe on fds 3 and 4 exactly.  A tiny Python launcher moves the ends
        # there and execs it: no preexec_fn, so no fork of a process that JAX made multithreaded.
        launcher = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                    "os.execv(sys.argv[3], sys.argv[3:])")
        self._proc = subprocess.Popen([sys.executable, "-c", launcher, str(cmd_r), str(out_w), self.executable, *flags],
                                      pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)

    # ------------------------------------------------------------ protocol --
    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        self._next_id += 1
        msg_id = self._next_id
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for k, m in enumerate(self._events):
                if m.get("id") == msg_id:
                    del self._events[k]
                    if "error" in m:
                        raise BrowserError(f"{method}: {m['error'].get('message')}")
                    return m.get("result", {})
            self._read(deadline, f"an answer to {method}")

    def _read(self, deadline: float, what: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrowserError(f"Chromium gave no {what} in time")
        ready, _, _ = select.select([self._out_r], [], [], remaining)
        if not ready:
            raise BrowserError(f"Chromium gave no {what} in time")
        chunk = os.read(self._out_r, 1 << 20)
        if not chunk:
            raise BrowserError("Chromium closed its DevTools pipe (it exited)")
        self._buffer += chunk
        *records, self._buffer = self._buffer.split(b"\0")
        self._events.extend(json.loads(r) for r in records if r)

    def take_events(self, session: str) -> list[dict]:
        mine = [e for e in self._events if "method" in e and e.get("sessionId") == session]
        self._events = [e for e in self._events if not ("method" in e and e.get("sessionId") == session)]
        return mine

    def wait_event(self, session: str, method: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for k, e in enumerate(self._events):
                if e.get("method") == method and e.get("sessionId") == session:
                    del self._events[k]
                    return e
            self._read(deadline, f"{method} event")

    def pump(self) -> None:
        """Read whatever the browser has sent so far, without waiting."""
        while select.select([self._out_r], [], [], 0)[0]:
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                return
            self._buffer += chunk
            *records, self._buffer = self._buffer.split(b"\0")
            self._events.extend(json.loads(r) for r in records if r)

    # --------------------------------------------------------------- pages --
    def open(self, url: str, width: int = 1600, height: int = 1000, ready: str = "document.body.dataset.ready === '1'",
             timeout: float | None = None) -> "Page":
        """A new tab showing `url`, returned once `ready` (a JS expression) is true."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session, target)
        for domain in ("Runtime", "Page", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        start = time.perf_counter()
        self.send("Page.navigate", {"url": url}, session=session)
        page.wait_for(ready, timeout=timeout)
        page.open_seconds = time.perf_counter() - start
        return page

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.send("Browser.close", timeout=5)
            except (BrowserError, OSError):
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str, target: str):
        self.browser = browser
        self.session = session
        self.target = target
        self.open_seconds = 0.0
        self._errors: list[str] = []
        self._requests: list[str] = []

    def _collect(self) -> None:
        self.browser.pump()
        for e in self.browser.take_events(self.session):
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                self._errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self._errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                           for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                self._errors.append("log: " + params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                self._requests.append(params.get("request", {}).get("url", ""))

    @property
    def errors(self) -> list[str]:
        self._collect()
        return list(self._errors)

    @property
    def requests(self) -> list[str]:
        self._collect()
        return list(self._requests)

    def evaluate(self, expression: str, timeout: float | None = None):
        """The value of a JS expression (promises awaited), as JSON-able Python."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, session=self.session, timeout=timeout)
        self._collect()
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}: " + (d.get("exception", {}).get("description") or d.get("text", "")))
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while True:
            try:
                if self.evaluate(f"Boolean({expression})"):
                    return
            except BrowserError:
                pass  # the document may not exist yet
            if time.monotonic() > deadline:
                raise BrowserError(f"page never got to {expression!r}; errors: {self.errors}")
            time.sleep(0.02)

    def click(self, selector: str, index: int = 0) -> None:
        """A real mouse click (pressed and released) at the middle of the element."""
        # Two animation frames after scrolling, so that the browser hit-tests the scrolled layout.
        box = self.evaluate(
            f"(async () => {{ const e = document.querySelectorAll({json.dumps(selector)})[{index}];"
            " if (!e) return null; e.scrollIntoView({block: 'center', inline: 'center'});"
            " await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));"
            " const r = e.getBoundingClientRect(); return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2]"
            " : 'hidden'; })()")
        if box is None:
            raise BrowserError(f"nothing matches {selector!r} (index {index})")
        if box == "hidden":
            raise BrowserError(f"{selector!r} (index {index}) is not displayed: it cannot be clicked")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.browser.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                           "clickCount": 1}, session=self.session)
        self._collect()

    def type_text(self, selector: str, text: str, enter: bool = True) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.browser.send("Input.insertText", {"text": text}, session=self.session)
        if enter:
            for kind in ("keyDown", "keyUp"):
                self.browser.send("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                             "windowsVirtualKeyCode": 13}, session=self.session)
        self._collect()

    def screenshot(self, path: str | Path, full_page: bool = False) -> None:
        params: dict = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")


def _above_4(fd: int) -> int:
    if fd > 4:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
    os.close(fd)
    return high


