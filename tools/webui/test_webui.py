#!/usr/bin/env python3
"""The chat page of `k3 serve` (docs/SERVER.md "Chat page") in a real browser: Debian's
headless Chromium driven by Selenium, against `k3 serve fixtures/tiny-k3` on 127.0.0.1.

Selenium Manager is kept off the network (SE_OFFLINE, SE_AVOID_STATS) and never picks a
driver: the browser and driver are /usr/bin/chromium and /usr/bin/chromedriver. Every wait is
bounded; the servers are stopped at the end. Screenshots of the main states go to
$K3_WEBUI_SHOTS (default: a fresh temporary directory, printed). Exits non-zero on any failure
and closes with `N passed, M failed`.

    python3 tools/webui/test_webui.py            # needs target/debug/k3 (or $K3_BIN)
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

os.environ["SE_AVOID_STATS"] = "true"
os.environ["SE_OFFLINE"] = "true"

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "clients"))
from _k3_server import START_TIMEOUT_S, k3_binary  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
KEY = "k3-webui-test-key"
WAIT_S = 60
FIRST_RENDER_LIMIT_MS = 1000
# The tiny model's greedy reply to this prompt runs to max_tokens (measured: 512 of 512), so
# a reply with room for 4000 tokens is still streaming when the test presses Stop.
LONG_PROMPT = "Hello **K3**, write `code`"
HOSTILE = "<img src=x onerror=window.__pwned=1> <script>window.__pwned=1</script>"

RESULTS = []


def check(name, fn):
    """Runs one named check; a failure is recorded with its reason, never stops the run."""
    try:
        fn()
        RESULTS.append((name, None))
        print(f"ok   {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported by name
        RESULTS.append((name, e))
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def expect(cond, message):
    if not cond:
        raise AssertionError(message)


class Server:
    """`k3 serve fixtures/tiny-k3 --host 127.0.0.1 --port 0 [extra]`: by default two slots, and
    a newcomer's prompt fed one token per step beside a running reply (`--ubatch 1`), so the
    tiny model's prefill lasts long enough for the page to show its progress."""

    def __init__(self, extra=("--parallel", "2", "--ubatch", "1")):
        self.runtime = tempfile.TemporaryDirectory(prefix="k3-webui-run-")
        args = [k3_binary(), "serve", str(ROOT / "fixtures/tiny-k3"), "--host", "127.0.0.1",
                "--port", "0", "--threads", "2", *extra]
        env = dict(os.environ, XDG_CONFIG_HOME="/nonexistent/k3-webui-test",
                   XDG_RUNTIME_DIR=self.runtime.name)
        env.pop("K3_CONFIG", None)
        env.pop("K3_API_KEY", None)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.base = None
        self.log = []
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if "listening on " in line and not self.base:
                    self.base = line.split("listening on ", 1)[1].strip()
                    found.set()
            found.set()  # the server exited
        threading.Thread(target=read, daemon=True).start()
        if not found.wait(START_TIMEOUT_S) or not self.base:
            self.stop()
            raise RuntimeError(f"k3 serve did not print its address within {START_TIMEOUT_S} s:"
                               f" {''.join(self.log)}")

    def request(self, path, body=None, key=None, timeout=120):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()

    def status(self, key=None):
        return json.loads(self.request("/v1/status", key=key)[2])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.runtime.cleanup()


def browser(profile_dir, width=1280, height=900):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class Page:
    def __init__(self, driver, base, shots):
        self.d = driver
        self.base = base
        self.shots = shots
        self.console = []

    def wait(self, cond, what, timeout=WAIT_S):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.05).until(lambda d: cond())
        except TimeoutException:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None

    def find(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def finds(self, css):
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def text(self, css):
        """The rendered text of the first match, read in one script call (a streaming reply's
        elements are replaced at every token, so a found element may be gone a moment later)."""
        return self.js("const e = document.querySelector(arguments[0]);"
                       " if (!e) throw new Error('no ' + arguments[0]); return e.innerText;", css)

    def status_text(self):
        return self.text("#status-text")

    def shot(self, name):
        self.d.save_screenshot(str(self.shots / f"{name}.png"))

    def collect_console(self):
        self.console += self.d.get_log("browser")

    def send(self, text):
        box = self.find("#input")
        box.clear()
        box.send_keys(text)
        box.send_keys(Keys.ENTER)

    def replies(self):
        return self.finds(".msg.assistant")

    def idle(self):
        return self.find("#stop").get_attribute("hidden") is not None

    def pwned(self):
        return self.js("return typeof window.__pwned === 'undefined' ? null : window.__pwned;")

    def set_setting(self, field_id, value):
        self.find("#open-settings").click()
        field = self.find(field_id)
        field.clear()
        field.send_keys(str(value))
        self.find("#settings-save").click()
        self.wait(lambda: not self.js("return document.getElementById('settings').open"), "settings to close")


def long_background_jobs(server, n, tokens=3000):
    """`n` long non-streamed completions, each holding one of the server's slots."""
    body = {"prompt": "a", "max_tokens": tokens, "ignore_eos": True}
    threads = [threading.Thread(target=lambda: server.request("/v1/completions", body), daemon=True)
               for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        if len(server.status()["jobs"]) == n:
            return threads
        time.sleep(0.02)
    raise AssertionError("the background jobs never showed in /v1/status")


def main_flow(server, shots, profile):
    d = browser(profile)
    p = Page(d, server.base, shots)
    try:
        run_main_checks(p, server)
    finally:
        try:
            p.collect_console()
        finally:
            d.quit()
    severe = [e for e in p.console if e.get("level") == "SEVERE"]
    check("the browser console has no SEVERE entry",
          lambda: expect(not severe, f"SEVERE console entries: {severe}"))
    return p


def run_main_checks(p, server):
    def load():
        p.d.get(p.base + "/")
        p.wait(lambda: p.status_text().startswith("ready"), "the status to say ready")
        expect(p.d.title == "K3 chat", p.d.title)
        fcp = p.js("const e = performance.getEntriesByName('first-contentful-paint')[0];"
                   " return e ? e.startTime : null;")
        nav = p.js("const n = performance.getEntriesByType('navigation')[0];"
                   " return [n.domContentLoadedEventEnd, n.loadEventEnd];")
        expect(fcp is not None, "no first-contentful-paint entry")
        print(f"     first contentful paint {fcp:.0f} ms, DOMContentLoaded {nav[0]:.0f} ms,"
              f" load {nav[1]:.0f} ms", flush=True)
        expect(fcp < FIRST_RENDER_LIMIT_MS, f"first render took {fcp:.0f} ms")
        expect("weights used in place" in p.text("#plan-summary"), p.text("#plan-summary"))
        p.shot("01-empty")
    check("the page loads offline, renders within 1 s and shows the plan", load)

    def headers():
        _, h, body = server.request("/")
        csp = h.get("content-security-policy", "")
        expect("default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp, csp)
        expect(b"<script>" not in body, "inline script in the page")
        for path in ("/favicon.ico", "/favicon.svg", "/webui/app.js", "/webui/render.js",
                     "/webui/status.js", "/webui/app.css",
                     "/webui/markdown-it.min.js"):
            status, _, _ = server.request(path)
            expect(status == 200, f"{path}: {status}")
    check("the page carries a strict CSP and every asset (favicon too) is served", headers)

    def stream():
        box = p.find("#input")
        box.send_keys("first line", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "second line")
        expect(p.js("return document.getElementById('input').value") == "first line\nsecond line",
               "Shift+Enter did not make a new line")
        expect(not p.finds(".msg"), "Shift+Enter sent the message")
        p.send("Hi there")
        p.wait(lambda: len(p.replies()) == 1 and p.finds(".msg.assistant .meta"), "the first reply")
        reply = p.replies()[0]
        expect(reply.find_element(By.CSS_SELECTOR, ".bubble").text.strip(), "empty reply")
        meta = reply.find_element(By.CSS_SELECTOR, ".meta").text
        expect("tokens" in meta and ("s/token" in meta or "tokens/s" in meta), meta)
        expect(p.idle(), "the Stop button is still shown")
        expect(p.text("#conv-list li.current") == "Hi there", p.text("#conv-list"))
        p.shot("02-reply")
    check("a message gets a streamed reply with its speed", stream)

    def queued_and_thinking():
        Select(p.find("#effort")).select_by_value("high")
        background = long_background_jobs(server, 2)
        p.send("Think about it")
        p.wait(lambda: "waiting in queue: position 1 of 1" in p.status_text(),
               "the queue position in the status")
        p.shot("03-queued")
        p.wait(lambda: p.finds(".msg.assistant:last-child details.thinking"), "the thinking block", 120)
        p.wait(lambda: p.idle(), "the reply to finish", 120)
        for t in background:
            t.join(120)
        think = p.find(".msg.assistant:last-child details.thinking")
        expect(think.find_element(By.CSS_SELECTOR, "summary").text.startswith(("Thought", "Thinking")),
               think.text)
        Select(p.find("#effort")).select_by_value("off")
    check("a queued request shows its queue position, then its thinking apart", queued_and_thinking)

    def prefill():
        background = long_background_jobs(server, 1)
        # a long prompt (about 1000 tokens), fed one token per step beside the running job
        p.find("#new-chat").click()
        p.js("document.getElementById('input').value = arguments[0];", "many words " * 200)
        p.find("#input").send_keys(Keys.ENTER)
        p.wait(lambda: "reading the prompt" in p.status_text() and "left" in p.status_text(),
               "the prefill progress with an ETA")
        expect(p.find("#prefill-bar").is_displayed(), "no progress bar")
        p.shot("04-prefill")
        p.wait(lambda: p.idle(), "the reply to finish", 120)
        for t in background:
            t.join(120)
    check("a long prompt shows its prefill progress and ETA", prefill)

    def stop():
        p.set_setting("#set-max-tokens", 4000)
        saved = p.js("return JSON.parse(localStorage.getItem('k3.settings')).max_tokens")
        expect(saved == "4000", f"max tokens saved as {saved!r}")
        p.find("#new-chat").click()
        p.send(LONG_PROMPT)
        p.wait(lambda: len(p.text(".msg.assistant .bubble")) > 40, "streamed text")
        p.shot("05-streaming")
        p.find("#stop").click()
        p.wait(lambda: p.finds(".msg.assistant .meta"), "the stopped reply's meta line")
        meta = p.text(".msg.assistant .meta")
        expect("stopped" in meta, meta)
        expect(p.idle() and p.find("#send").is_displayed(), "Send is not back")
        p.wait(lambda: server.status()["jobs"] == [], "the server to drop the stopped reply", 10)
        p.set_setting("#set-max-tokens", 64)
    check("Stop ends a reply mid-stream (and the server drops it)", stop)

    def edit():
        p.find(".msg.user .edit").click()
        area = p.find(".msg.user .edit-area")
        area.clear()
        area.send_keys("An edited question")
        p.find(".msg.user .edit-buttons .primary").click()
        p.wait(lambda: p.finds(".msg.assistant .meta") and p.idle(), "the regenerated reply")
        users = [e.text for e in p.finds(".msg.user .bubble")]
        expect(users == ["An edited question"], users)
        # the settings' max tokens (64) went with the request
        tokens = int(p.text(".msg.assistant .meta").split(" tokens")[0])
        expect(tokens <= 64, f"{tokens} tokens with max tokens 64")
        expect(len(p.replies()) == 1, "the old reply was kept")
        before = p.text(".msg.assistant .bubble")
        p.find(".msg.assistant .regenerate").click()
        p.wait(lambda: p.finds(".msg.assistant .meta") and p.idle(), "the regenerated reply")
        expect(len(p.replies()) == 1 and p.text(".msg.assistant .bubble") == before,
               "greedy regeneration differs")
    check("editing a user turn regenerates from it; Regenerate replaces the reply", edit)

    def reload():
        titles = [e.text for e in p.finds("#conv-list li")]
        p.d.refresh()
        p.wait(lambda: p.status_text().startswith("ready"), "the page after reload")
        expect([e.text for e in p.finds("#conv-list li")] == titles, "conversations changed")
        expect([e.text for e in p.finds(".msg.user .bubble")] == ["An edited question"],
               "the current conversation was not restored")
    check("a reload finds the conversations again", reload)

    def hostile_user_turn():
        p.find("#new-chat").click()
        p.send(HOSTILE)
        p.wait(lambda: p.finds(".msg.assistant .meta") and p.idle(), "the reply")
        expect(p.pwned() is None, f"window.__pwned = {p.pwned()}")
        expect(p.text(".msg.user .bubble") == HOSTILE, p.text(".msg.user .bubble"))
        expect(not p.finds("#messages img") and not p.finds("#messages script"), "markup was rendered")
    check("HTML and script in a user turn show as text and never run", hostile_user_turn)

    def imported():
        conversation = {
            "format": "k3-webui-conversations", "version": 1,
            "conversations": [{
                "title": "Imported <b>hostile</b>",
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": "Show me something"},
                    {"role": "assistant", "reasoning_content": "Let me <script>window.__pwned=2</script> think",
                     "content": "Here is **bold** and " + HOSTILE +
                                "\n\n[click](javascript:window.__pwned=3)\n\n```python\nprint('<b>hi</b>')\n```\n",
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\":\"<b>Oslo</b>\"}"}}]},
                ],
            }],
        }
        path = pathlib.Path(tempfile.mkdtemp(prefix="k3-webui-import-")) / "chats.json"
        path.write_text(json.dumps(conversation))
        p.find("#import-file").send_keys(str(path))
        p.wait(lambda: p.text("#conv-title") == "Imported <b>hostile</b>", "the imported conversation")
        bubble = p.find(".msg.assistant .bubble")
        expect(p.pwned() is None, f"window.__pwned = {p.pwned()}")
        expect(HOSTILE in bubble.text, bubble.text)
        expect(not p.finds("#messages img") and not p.finds("#messages script") and not p.finds(".bubble b"),
               "markup from the reply was rendered")
        expect(bubble.find_element(By.CSS_SELECTOR, "strong").text == "bold", "no Markdown")
        expect(not p.js("return Array.from(document.querySelectorAll('#messages a'))"
                        ".some(a => (a.getAttribute('href') || '').startsWith('javascript'))"),
               "a javascript: link was rendered")
        code = p.find(".msg.assistant .code-wrap")
        expect("print('<b>hi</b>')" in code.find_element(By.CSS_SELECTOR, "pre").text, code.text)
        expect(code.find_element(By.CSS_SELECTOR, "button.copy").text == "Copy", "no copy button")
        think = p.find(".msg.assistant details.thinking")
        think.find_element(By.CSS_SELECTOR, "summary").click()
        expect("<script>" in think.find_element(By.CSS_SELECTOR, ".think-body").text, think.text)
        call = p.find(".msg.assistant .tool-call")
        expect("get_weather" in call.text and "<b>Oslo</b>" in call.text and "Not executed" in call.text,
               call.text)
        expect(p.pwned() is None, f"window.__pwned = {p.pwned()}")
        p.shot("06-imported")
    check("an imported reply with HTML, script and a javascript: link renders inert", imported)

    def rename_export_delete():
        p.find("#rename").click()
        # the page selects the old name: typing replaces it (clear() would blur, which saves)
        p.find("#title-edit").send_keys("Renamed chat", Keys.ENTER)
        p.wait(lambda: p.text("#conv-title") == "Renamed chat", "the new name")
        exported = json.loads(p.js("return window.k3chat.exportText();"))
        titles = [c["title"] for c in exported["conversations"]]
        expect(exported["format"] == "k3-webui-conversations" and "Renamed chat" in titles, titles)
        count = len(p.finds("#conv-list li"))
        p.find("#delete").click()
        p.wait(lambda: _alert(p.d), "the delete confirmation")
        p.d.switch_to.alert.accept()
        p.wait(lambda: len(p.finds("#conv-list li")) == count - 1, "the conversation to go")
        expect("Renamed chat" not in [e.text for e in p.finds("#conv-list li")], "still listed")
    check("rename, export as JSON, delete", rename_export_delete)

    def phone_dark():
        # a headless window is at least 500 px wide: a phone is emulated instead
        p.d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
        p.d.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        p.wait(lambda: p.find("#open-side").is_displayed(), "the narrow layout")
        bg = p.js("return getComputedStyle(document.body).backgroundColor")
        expect(bg == "rgb(22, 24, 29)", f"body background {bg} is not the dark one")
        width = p.js("return document.documentElement.scrollWidth")
        expect(width <= 390, f"the page scrolls sideways: {width}px")
        p.shot("07-phone-dark")
        p.find("#open-side").click()
        p.wait(lambda: p.find("#conv-list li").is_displayed(), "the drawer")
        time.sleep(0.3)
        p.shot("08-phone-drawer")
        p.find("#close-side").click()
        p.d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    check("at phone width in dark mode the page fits and the list is a drawer", phone_dark)


def _alert(driver):
    try:
        driver.switch_to.alert
        return True
    except Exception:  # noqa: BLE001 - no alert yet
        return False


def key_flow(shots, profile):
    # a budget that streams most of the trunk: the plan line has something to say
    server = Server(["--api-key", KEY, "--trunk-gb", "0.0006", "--cache-gb", "0.0006"])
    d = browser(profile)
    p = Page(d, server.base, shots)
    try:
        def asks():
            p.d.get(server.base + "/")
            p.wait(lambda: p.js("return document.getElementById('key-dialog').open"), "the key dialog")
            p.shot("09-api-key")
            # a wrong key is refused and asked for again (its 401 is the only console error)
            p.find("#key-input").send_keys("not-the-key", Keys.ENTER)
            p.wait(lambda: p.js("return document.getElementById('key-dialog').open")
                   and "refused" in p.text("#key-error"), "the key dialog to ask again")
            refused = [e for e in p.d.get_log("browser") if e.get("level") == "SEVERE"]
            expect(refused and all("/v1/status" in e["message"] and "401" in e["message"] for e in refused),
                   f"console after a wrong key: {refused}")
            p.find("#key-input").send_keys(KEY, Keys.ENTER)
            p.wait(lambda: p.status_text().startswith("ready"), "the status with the key")
            expect(p.js("return sessionStorage.getItem('k3.apiKey')") == KEY, "key not in sessionStorage")
            expect(KEY not in p.d.current_url, "the key is in the URL")
            expect(KEY not in (p.js("return JSON.stringify(localStorage)") or ""), "the key is in localStorage")
            p.send("Hello with a key")
            p.wait(lambda: p.finds(".msg.assistant .meta") and p.idle(), "the reply")
            expect(not p.finds(".msg.error"), p.text(".msg.assistant"))
            summary = p.text("#plan-summary")
            expect("pinned, streams" in summary and "trunk 600.00 KB + cache 600.00 KB" in summary, summary)
            p.find("#plan-summary").click()
            plan = p.text("#plan-list")
            expect("expert cache" in plan and "hit rate" in plan, plan)
            p.shot("10-plan")
            # The page and its assets are open; the API is not.
            for path in ("/", "/webui/app.js", "/favicon.ico"):
                expect(server.request(path)[0] == 200, path)
            try:
                server.request("/v1/status")
                raise AssertionError("/v1/status answered without the key")
            except urllib.error.HTTPError as e:
                expect(e.code == 401, f"/v1/status without the key: {e.code}")
        check("with an API key the page asks for it, refuses a wrong one and sends it as a Bearer header",
              asks)
        p.collect_console()
        severe = [e for e in p.console if e.get("level") == "SEVERE"]
        check("the keyed page's console has no SEVERE entry",
              lambda: expect(not severe, f"SEVERE console entries: {severe}"))
    finally:
        d.quit()
        server.stop()


def no_webui_flow():
    server = Server(["--no-webui"])
    try:
        def off():
            try:
                server.request("/")
                raise AssertionError("/ answered with --no-webui")
            except urllib.error.HTTPError as e:
                expect(e.code == 404 and b"no such endpoint" in e.read(), f"{e.code}")
            expect(server.status()["state"] == "idle", "the status endpoint is gone")
        check("--no-webui turns the page off (the API stays)", off)
    finally:
        server.stop()


def main():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: apt-get install -y chromium chromium-driver")
    shots = pathlib.Path(os.environ.get("K3_WEBUI_SHOTS") or tempfile.mkdtemp(prefix="k3-webui-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {shots}", flush=True)
    with tempfile.TemporaryDirectory(prefix="k3-webui-profile-") as profiles:
        server = Server()
        try:
            main_flow(server, shots, os.path.join(profiles, "main"))
        finally:
            server.stop()
        key_flow(shots, os.path.join(profiles, "key"))
    no_webui_flow()
    failed = [name for name, err in RESULTS if err is not None]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
