"""A small W3C WebDriver client (standard library only) for driving the app window through tauri-driver."""

import http.client
import json
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class WebDriverError(Exception):
    pass


def wait(what, condition, timeout=20, interval=0.25):
    """Calls condition() until it returns something truthy, tolerating errors from what is not up yet;
    fails with `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = condition()
            if last:
                return last
        except (WebDriverError, OSError, KeyError, ValueError) as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Session:
    def __init__(self, driver_url, application, timeout=60):
        self.base = driver_url.rstrip("/")
        caps = {"capabilities": {"alwaysMatch": {"browserName": "wry", "tauri:options": {"application": application}}}}
        deadline = time.time() + timeout
        while True:
            try:
                value = self._call("POST", "/session", caps, base=self.base)
                break
            except (urllib.error.URLError, ConnectionError, WebDriverError) as e:
                # tauri-driver answers before WebKitWebDriver listens: a session asked for too early is lost.
                if time.time() > deadline:
                    raise WebDriverError(f"tauri-driver did not answer at {self.base}: {e}") from e
                time.sleep(0.3)
        self.id = value["sessionId"]

    def _call(self, method, path, body=None, base=None):
        url = (base or f"{self.base}/session/{self.id}") + path
        data = None if body is None else json.dumps(body).encode()
        # tauri-driver proxies to WebKitWebDriver and sometimes loses a request on a stale pooled connection
        # ("client error (SendRequest)"): the request never reached the browser, so sending it again is safe.
        for attempt in range(4):
            request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    return json.loads(response.read() or b"{}").get("value")
            except urllib.error.HTTPError as e:
                raise WebDriverError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from e
            except (http.client.RemoteDisconnected, ConnectionResetError) as e:
                if attempt == 3 or base is not None:
                    raise WebDriverError(f"{method} {path}: {e}") from e
                time.sleep(0.5)

    def script(self, source, *args):
        return self._call("POST", "/execute/sync", {"script": source, "args": list(args)})

    def find_all(self, css):
        return [e[ELEMENT] for e in self._call("POST", "/elements", {"using": "css selector", "value": css})]

    def click(self, element):
        self._call("POST", f"/element/{element}/click", {})

    def type(self, element, text):
        self._call("POST", f"/element/{element}/value", {"text": text})

    def text(self, element):
        return self._call("GET", f"/element/{element}/text")

    def screenshot(self, path):
        import base64

        with open(path, "wb") as f:
            f.write(base64.b64decode(self._call("GET", "/screenshot")))

    def wait_for(self, what, condition, timeout=20, interval=0.25):
        """Calls condition() until it returns something truthy; fails with `what` after `timeout` seconds."""
        return wait(what, condition, timeout, interval)

    def close(self):
        try:
            self._call("DELETE", "")
        except Exception:
            pass
