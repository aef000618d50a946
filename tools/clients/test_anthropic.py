#!/usr/bin/env python3
"""The official `anthropic` Python client against `k3 serve fixtures/tiny-k3` (docs/SERVER.md
"Anthropic Messages API"): text replies, the streamed events in Anthropic's order, thinking
blocks, count_tokens, x-api-key, a request without max_tokens refused with a 400 in
Anthropic's error shape, and tools (docs/SERVER.md "Tools"): `tool_choice` any / tool give a
`tool_use` block whose `input` validates (the `jsonschema` package) with stop_reason
`tool_use`, streamed in Anthropic's event order, and a `tool_result` follow-up is answered.
At the edges (docs/SERVER.md "Control tokens", "Limits", "Tools"): `max_tokens` past the
context is a 400 whose message starts with `max_tokens`; text blocks and deltas never carry a
control-token spelling; a tool call cut by `max_tokens` is not returned and leaves no markup.

Starts and stops its own server on 127.0.0.1 (an ephemeral port), every wait bounded.
Run: python3 tools/clients/test_anthropic.py  (K3_BIN=path/to/k3 to pick the binary; needs
`pip install anthropic jsonschema`).
"""

import json
import sys
import unittest

import anthropic
import jsonschema

from _k3_server import (KEY, REQUEST_TIMEOUT_S, WEATHER_PARAMS, Server, control_spellings,
                        spelling_in)


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


WEATHER_TOOL = {"name": "get_weather", "description": "Weather forecast for a city",
                "input_schema": WEATHER_PARAMS}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


class Tools(unittest.TestCase):
    def call(self, seed, **kwargs):
        # This SDK's create() has no `temperature`: the body field goes through extra_body.
        args = dict(model="tiny-k3", max_tokens=400, messages=ASK, tools=[WEATHER_TOOL],
                    extra_body={"seed": seed, "temperature": 1})
        args.update(kwargs)
        return client().messages.create(**args)

    def check_tool_use(self, message):
        self.assertEqual(message.stop_reason, "tool_use", message)
        uses = [b for b in message.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1, message)
        self.assertTrue(uses[0].id.startswith("toolu_"))
        self.assertEqual(uses[0].name, "get_weather")
        jsonschema.validate(uses[0].input, WEATHER_PARAMS)
        return uses[0]

    def test_any_and_a_named_tool_return_valid_tool_use(self):
        for seed in range(1, 4):
            for choice in ({"type": "any", "disable_parallel_tool_use": True},
                           {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": True}):
                with self.subTest(seed=seed, choice=choice["type"]):
                    self.check_tool_use(self.call(seed, tool_choice=choice))

    def test_a_tool_result_follow_up_is_answered(self):
        first = self.call(5, tool_choice={"type": "any", "disable_parallel_tool_use": True})
        use = self.check_tool_use(first)
        history = ASK + [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "Rain, 12 C"}]},
        ]
        answer = client().messages.create(model="tiny-k3", max_tokens=16, messages=history,
                                          tools=[WEATHER_TOOL])
        self.assertIn(answer.stop_reason, ("end_turn", "max_tokens", "tool_use"))
        self.assertGreater(answer.usage.input_tokens, first.usage.input_tokens)

    def test_streamed_tool_use_comes_in_order_and_matches_the_whole_reply(self):
        args = dict(tool_choice={"type": "any", "disable_parallel_tool_use": True})
        whole = self.call(7, **args)
        with client().messages.stream(model="tiny-k3", max_tokens=400, messages=ASK,
                                      tools=[WEATHER_TOOL],
                                      extra_body={"seed": 7, "temperature": 1},
                                      **args) as stream:
            events = client_events(stream)
            final = stream.get_final_message()
        kinds = [e.type for e in events]
        self.assertEqual(kinds[:2], ["message_start", "content_block_start"])
        self.assertEqual(events[1].content_block.type, "tool_use")
        self.assertEqual(kinds[-3:], ["content_block_stop", "message_delta", "message_stop"])
        self.assertTrue(all(k == "content_block_delta" for k in kinds[2:-3]), kinds)
        partial = "".join(e.delta.partial_json for e in events[2:-3])
        jsonschema.validate(json.loads(partial), WEATHER_PARAMS)
        self.assertEqual(self.check_tool_use(final).input, self.check_tool_use(whole).input)


def client_events(stream):
    """The raw events of a MessageStream (the helper's own text/thinking events dropped)."""
    raw = {"message_start", "message_delta", "message_stop", "content_block_start",
           "content_block_delta", "content_block_stop"}
    return [e for e in stream if e.type in raw]


SPELLINGS = control_spellings()


def texts_and_calls(message):
    """Text of the text and thinking blocks, and the tool_use blocks, of a Message."""
    texts = [getattr(b, "text", None) or getattr(b, "thinking", "") for b in message.content
             if b.type in ("text", "thinking")]
    return texts, [b for b in message.content if b.type == "tool_use"]


class Edges(unittest.TestCase):
    def test_max_tokens_past_the_context_is_refused(self):
        for stream in (False, True):
            with self.assertRaises(anthropic.BadRequestError) as caught:
                client().messages.create(model="tiny-k3", max_tokens=10**9, messages=HELLO,
                                         stream=stream)
            message = caught.exception.body["error"]["message"]
            self.assertTrue(message.startswith("max_tokens"), message)
            self.assertIn("maximum context length is 4096 tokens", message)
            self.assertIn("in the prompt", message)

    def test_text_blocks_carry_no_control_tokens(self):
        for seed in range(4):
            with self.subTest(seed=seed):
                args = dict(model="tiny-k3", max_tokens=48, messages=HELLO,
                            extra_body={"seed": seed, "temperature": 1})
                texts, _ = texts_and_calls(client().messages.create(**args))
                for text in texts:
                    self.assertIsNone(spelling_in(text, SPELLINGS), texts)
                with client().messages.stream(**args) as stream:
                    deltas = [e.delta.text for e in client_events(stream)
                              if e.type == "content_block_delta" and e.delta.type == "text_delta"]
                for delta in deltas:
                    self.assertIsNone(spelling_in(delta, SPELLINGS), deltas)
                self.assertEqual("".join(deltas), "".join(texts))

    def test_a_tool_call_cut_by_max_tokens_is_not_returned(self):
        choice = {"type": "any", "disable_parallel_tool_use": True}
        cut = 0
        for max_tokens in range(40, 97, 8):
            with self.subTest(max_tokens=max_tokens):
                args = dict(model="tiny-k3", max_tokens=max_tokens, messages=ASK,
                            tools=[WEATHER_TOOL], tool_choice=choice,
                            extra_body={"seed": 6, "temperature": 1})
                m = client().messages.create(**args)
                texts, uses = texts_and_calls(m)
                for text in texts:
                    self.assertIsNone(spelling_in(text, SPELLINGS), m)
                for use in uses:
                    jsonschema.validate(use.input, WEATHER_PARAMS)
                self.assertIn(m.stop_reason, ("max_tokens", "tool_use"))
                cut += not uses
                with client().messages.stream(**args) as stream:
                    final = stream.get_final_message()
                self.assertEqual(final.stop_reason, m.stop_reason)
                self.assertEqual([u.input for u in texts_and_calls(final)[1]],
                                 [u.input for u in uses])
        self.assertGreater(cut, 0, "some max_tokens cut the call")


if __name__ == "__main__":
    SERVER = Server()
    try:
        result = unittest.main(exit=False, verbosity=2).result
    finally:
        SERVER.stop()
    sys.exit(0 if result.wasSuccessful() else 1)
