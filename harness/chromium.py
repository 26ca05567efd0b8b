"""Headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol, for tests of web pages.

The browser is started with ``--remote-debugging-pipe``: it reads protocol commands from its
file descriptor 3 and writes answers and events to 4, each message JSON ending in a NUL byte,
so no WebSocket client is needed. It runs with an empty profile of its own, no sandbox (it may
run as root in CI), and nothing that reaches the network but the pages it is sent to (no QUIC,
no background networking, component updates or sync). Nothing is downloaded: a machine without
``chromium`` gets a :class:`HarnessError` saying how to install it (``scripts/bootstrap`` does).

Example::

    with Chromium() as browser:
        page = browser.open("http://127.0.0.1:8000/feed/7")
        page.wait_for("document.readyState === 'complete'")
        page.evaluate("document.querySelectorAll('li').length")
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import HarnessError

__all__ = ["Chromium", "Tab", "find_chromium"]

#: The flags every run gets (besides the pipe and the profile).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def find_chromium() -> Path:
    """Debian's ``chromium`` (or ``chromium-browser``) on PATH; :class:`HarnessError` saying how to install it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise HarnessError("chromium is not installed; install Debian's package with `apt-get install -y chromium` "
                       "(scripts/bootstrap does it when run as root)")


def _high(fd: int) -> int:
    """*fd* moved to a number of 10 or more (so the redirections to 3 and 4 cannot clobber it; bash, not dash, reads such numbers)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Chromium:
    """One headless Chromium with a profile of its own; :meth:`open` gives a :class:`Tab` to drive."""

    def __init__(self, *, timeout: float = 60.0) -> None:
        self.binary = find_chromium()
        self.timeout = timeout
        self._profile = Path(tempfile.mkdtemp(prefix="feedrouter-chromium-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._out: int | None = None
        self._next = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()

    def start(self) -> Chromium:
        commands_read, commands_write = os.pipe()
        answers_read, answers_write = os.pipe()
        theirs_in, theirs_out = _high(commands_read), _high(answers_write)
        log = (self._profile / "chromium.log").open("wb")
        args = [str(self.binary), *FLAGS, f"--user-data-dir={self._profile}", "--remote-debugging-pipe", "about:blank"]
        self._process = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{theirs_in} 4>&{theirs_out}', *args],
            pass_fds=(theirs_in, theirs_out), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        os.close(theirs_in)
        os.close(theirs_out)
        self._out = commands_write
        threading.Thread(target=self._read, args=(answers_read,), name="chromium-devtools", daemon=True).start()
        self.send("Browser.getVersion")
        return self

    def _read(self, fd: int) -> None:
        buffer = b""
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        with self._cond:
                            self._answers[message["id"]] = message
                            self._cond.notify_all()
        with self._cond:
            self._answers[-1] = {"error": {"message": "chromium closed its DevTools pipe"}}
            self._cond.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> dict[str, Any]:
        """Send one protocol command and wait for its answer's ``result``; :class:`HarnessError` for an error."""
        if self._out is None:
            raise HarnessError("chromium is not started")
        with self._send_lock:
            self._next += 1
            number = self._next
            message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
            if session is not None:
                message["sessionId"] = session
            os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while number not in self._answers and -1 not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HarnessError(f"chromium did not answer {method} within {self.timeout:.0f} s")
                self._cond.wait(left)
            answer = self._answers.pop(number, None) or self._answers[-1]
        if "error" in answer:
            raise HarnessError(f"chromium: {method}: {answer['error'].get('message')}; log:\n{self.log_tail()}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def open(self, url: str) -> Tab:
        """A new tab at *url* (navigation started)."""
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Tab(self, session)

    def log_tail(self) -> str:
        path = self._profile / "chromium.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-20:]) if path.exists() else ""

    def close(self) -> None:
        """Close the browser (Browser.close, then SIGTERM/SIGKILL if it lingers) and remove its profile."""
        if self._process is not None and self._process.poll() is None:
            try:
                self.send("Browser.close")
            except HarnessError:
                pass
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:  # its renderers are in its session: stop them all
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self._process.pid, sig)
                    try:
                        self._process.wait(10)
                        break
                    except subprocess.TimeoutExpired:
                        continue
        if self._out is not None:
            os.close(self._out)
            self._out = None
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Tab:
    """One page of a :class:`Chromium`: evaluate JavaScript in it, wait for a condition."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        """The value of *expression* in the page (JSON-able values only)."""
        answer = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   session=self.session)
        if "exceptionDetails" in answer:
            raise HarnessError(f"page: {expression}: {answer['exceptionDetails'].get('text')}")
        return answer.get("result", {}).get("value")

    def wait_for(self, expression: str, *, timeout: float = 60.0) -> Any:
        """Poll *expression* until it is truthy; return its value, or :class:`HarnessError` after *timeout* seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise HarnessError(f"page: {expression} still {value!r} after {timeout:.0f} s")
            time.sleep(0.05)
