"""A headless Chromium driven over the DevTools protocol on a pipe (standard library only).

``--remote-debugging-pipe`` makes Chromium read protocol messages from file
descriptor 3 and write them to 4, NUL-terminated JSON (what Puppeteer's pipe
transport does), so no websocket client and no extra package is needed.
Used by tests/cli/test_html_report.py to load the HTML report, collect console
messages, uncaught exceptions and network requests, run checks in the page and
take a screenshot.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

__all__ = ["find_chromium", "Browser", "BrowserError"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable ($CHROMIUM first), or None."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; use as a context manager.

    ``events`` collects every protocol event of the page (console calls,
    exceptions, log entries, requests) in arrival order.
    """

    def __init__(self, executable: str, *, width: int = 1280, height: int = 900, timeout: float = 60.0):
        self.timeout = timeout
        self.events: list[dict] = []
        self._profile = tempfile.mkdtemp(prefix="streammem-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_fds():  # in the child: fd 3 = what we write, fd 4 = what it writes
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--remote-debugging-pipe", f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
                "about:blank"]
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                      pass_fds=(3, 4), preexec_fn=wire_fds)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._session = None
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page", "Network"):
                self.call(f"{domain}.enable", session=True)
            self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                             "deviceScaleFactor": 1, "mobile": False}, session=True)
        except BaseException:
            self.close()
            raise

    # ---- protocol ----------------------------------------------------------
    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    self._stderr.seek(0)
                    raise BrowserError("Chromium exited: " + self._stderr.read().decode(errors="replace")[-2000:])
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _send(self, method: str, params: dict | None = None, *, session: bool = False) -> None:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data):]

    def call(self, method: str, params: dict | None = None, *, session: bool = False) -> dict:
        self._send(method, params, session=session)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        """The first event named ``method`` (already received or the next ones)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            event = self._read(deadline)
            if "method" in event:
                self.events.append(event)

    # ---- page ----------------------------------------------------------------
    def load(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        """Run JavaScript in the page and return its (JSON) value; a thrown error raises BrowserError."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path, *, full_page: bool = True) -> bytes:
        params = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000),
                              "scale": 1}
        png = base64.b64decode(self.call("Page.captureScreenshot", params, session=True)["data"])
        with open(path, "wb") as fh:
            fh.write(png)
        return png

    def console_errors(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and error log entries, as text."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                               for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    # ---- lifetime ------------------------------------------------------------
    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send("Browser.close")
            except OSError:
                pass
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        for fd in (self._to_browser, self._from_browser):
            if fd >= 0:
                os.close(fd)
        self._to_browser = self._from_browser = -1
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
