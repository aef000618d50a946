"""Shared by the client scripts in tools/clients (not a test itself: .ci/run skips `_*.py`):
`k3 serve fixtures/tiny-k3` on 127.0.0.1 with an ephemeral port, its address read from its
stderr, every wait bounded; and the bounded tool schema the tool tests use.
"""

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
