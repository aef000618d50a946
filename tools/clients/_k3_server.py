"""Shared by the client scripts in tools/clients (not a test itself: .ci/run skips `_*.py`):
`k3 serve fixtures/tiny-k3` on 127.0.0.1 with an ephemeral port, its address read from its
stderr, every wait bounded; the bounded tool schema the tool tests use; an open schema strict
mode refuses; and the control-token spellings no reply may carry.
"""

import json
import os
import pathlib
import queue
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "k3-client-test-key"
START_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 120

# A bounded schema (docs/SERVER.md "Tools"): even the tiny model's random weights finish a
# call within a few hundred tokens, because the constraint enforces every bound.
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


# An object a strict schema may not have: open (no additionalProperties: false) and with a
# property `required` leaves out (docs/SERVER.md "Strict schemas").
OPEN_NOTE = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["text"],
}


def control_spellings():
    """Every added token's spelling in the tiny model: none may reach a reply's text
    (docs/SERVER.md "Control tokens")."""
    config = json.loads((ROOT / "fixtures/tiny-k3/tokenizer_config.json").read_text())
    return [t["content"] for t in config["added_tokens_decoder"].values()]


def spelling_in(text, spellings):
    """The first control-token spelling in `text`, or None."""
    return next((s for s in spellings if s in (text or "")), None)


def k3_binary():
    if os.environ.get("K3_BIN"):
        return os.environ["K3_BIN"]
    for profile in ("debug", "release"):
        path = ROOT / "target" / profile / "k3"
        if path.exists():
            return str(path)
    sys.exit("no k3 binary: build it (cargo build -p k3-cli) or set K3_BIN")


class Server:
    """`k3 serve` on 127.0.0.1:0 with `--api-key KEY`; `base` is its address."""

    def __init__(self, model=None):
        model = model or str(ROOT / "fixtures/tiny-k3")
        args = [k3_binary(), "serve", model, "--host", "127.0.0.1", "--port", "0",
                "--threads", "2", "--api-key", KEY]
        env = dict(os.environ, XDG_CONFIG_HOME="/nonexistent/k3-client-test")
        env.pop("K3_CONFIG", None)
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        found = queue.Queue()
        threading.Thread(target=self._read, args=(found,), daemon=True).start()
        try:
            self.base = found.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.stop()
            sys.exit(f"k3 serve did not print its address within {START_TIMEOUT_S} s")

    def _read(self, found):
        for line in self.proc.stderr:
            if "listening on " in line:
                found.put(line.split("listening on ", 1)[1].strip())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
