#!/usr/bin/env python3
"""The official `anthropic` Python client against `k3 serve fixtures/tiny-k3` (docs/SERVER.md
"Anthropic Messages API"): text replies, the streamed events in Anthropic's order, thinking
blocks, count_tokens, x-api-key, and a request without max_tokens refused with a 400 in
Anthropic's error shape.

Starts and stops its own server on 127.0.0.1 (an ephemeral port), every wait bounded.
Run: python3 tools/clients/test_anthropic.py  (K3_BIN=path/to/k3 to pick the binary; needs
`pip install anthropic`).
"""

import os
import pathlib
import queue
import subprocess
import sys
import threading
import unittest

import anthropic

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "k3-client-test-key"
START_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 120


def k3_binary():
    if os.environ.get("K3_BIN"):
        return os.environ["K3_BIN"]
    for profile in ("debug", "release"):
        path = ROOT / "target" / profile / "k3"
        if path.exists():
            return str(path)
    sys.exit("no k3 binary: build it (cargo build -p k3-cli) or set K3_BIN")


class Server:
    """`k3 serve` on 127.0.0.1:0; the bound address is read from its stderr."""

    def __init__(self):
        args = [k3_binary(), "serve", str(ROOT / "fixtures/tiny-k3"), "--host", "127.0.0.1",
                "--port", "0", "--threads", "2", "--api-key", KEY]
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


SERVER = None


def client(key=KEY):
    return anthropic.Anthropic(base_url=SERVER.base, api_key=key, max_retries=0,
                               timeout=REQUEST_TIMEOUT_S)


HELLO = [{"role": "user", "content": "Hello"}]


class MessagesApi(unittest.TestCase):
    def test_text_reply(self):
        m = client().messages.create(model="tiny-k3", max_tokens=16,
                                     system="Be brief.", messages=HELLO)
        self.assertEqual((m.type, m.role), ("message", "assistant"))
        self.assertTrue(m.id.startswith("msg_"))
        self.assertEqual(m.content[0].type, "text")
        self.assertIsInstance(m.content[0].text, str)
        self.assertIn(m.stop_reason, ("end_turn", "max_tokens"))
        self.assertGreater(m.usage.input_tokens, 0)
        self.assertLessEqual(m.usage.output_tokens, 16)
        counted = client().messages.count_tokens(model="tiny-k3", system="Be brief.",
                                                 messages=HELLO)
        self.assertEqual(counted.input_tokens, m.usage.input_tokens)

    def test_streamed_events_come_in_order(self):
        args = dict(model="tiny-k3", max_tokens=16, messages=HELLO,
                    thinking={"type": "enabled", "budget_tokens": 4})
        whole = client().messages.create(**args)
        with client().messages.stream(**args) as stream:
            kinds = [event.type for event in client_events(stream)]
            final = stream.get_final_message()
        self.assertEqual(kinds[0], "message_start")
        self.assertEqual(kinds[-2:], ["message_delta", "message_stop"])
        blocks = [k for k in kinds if k.startswith("content_block")]
        opened = 0
        for k in blocks:  # start, deltas, stop; never nested
            if k == "content_block_start":
                self.assertEqual(opened, 0)
                opened = 1
            elif k == "content_block_stop":
                self.assertEqual(opened, 1)
                opened = 0
            else:
                self.assertEqual(opened, 1)
        self.assertEqual(opened, 0)
        self.assertEqual([b.type for b in final.content], [b.type for b in whole.content])
        self.assertEqual(final.content[0].type, "thinking")
        self.assertIsInstance(final.content[0].signature, str)
        for got, want in zip(final.content, whole.content):
            self.assertEqual(got.model_dump(), want.model_dump())
        self.assertEqual(final.stop_reason, whole.stop_reason)
        self.assertEqual(final.usage.output_tokens, whole.usage.output_tokens)

    def test_missing_max_tokens_is_a_400_in_anthropics_shape(self):
        with self.assertRaises(anthropic.BadRequestError) as caught:
            client().messages.create(model="tiny-k3", messages=HELLO,
                                     max_tokens=anthropic.NOT_GIVEN)
        e = caught.exception
        self.assertEqual(e.status_code, 400)
        self.assertEqual(e.body["type"], "error")
        self.assertEqual(e.body["error"]["type"], "invalid_request_error")
        self.assertTrue(e.body["error"]["message"].startswith("max_tokens"))

    def test_a_wrong_key_is_an_authentication_error(self):
        with self.assertRaises(anthropic.AuthenticationError) as caught:
            client("wrong").messages.create(model="tiny-k3", max_tokens=2, messages=HELLO)
        self.assertEqual(caught.exception.body["error"]["type"], "authentication_error")


def client_events(stream):
    """The raw events of a MessageStream (the helper's own text/thinking events dropped)."""
    raw = {"message_start", "message_delta", "message_stop", "content_block_start",
           "content_block_delta", "content_block_stop"}
    return [e for e in stream if e.type in raw]


if __name__ == "__main__":
    SERVER = Server()
    try:
        result = unittest.main(exit=False, verbosity=2).result
    finally:
        SERVER.stop()
    sys.exit(0 if result.wasSuccessful() else 1)
