#!/usr/bin/env python3
"""The official `openai` Python client against `k3 serve fixtures/tiny-k3` (docs/SERVER.md
"Tools"): tool calling and structured output. The tiny model's weights are random, so only
constrained decoding makes it call a tool or write JSON; every call's arguments and every JSON
reply is validated with the `jsonschema` package against the schema the request gave.

- `tool_choice="required"` and a named function return `tool_calls` whose arguments parse and
  validate, with `finish_reason "tool_calls"`;
- streamed `delta.tool_calls` reassemble to the same valid call;
- a follow-up with the `tool` message is rendered and answered;
- `response_format` `json_schema` (strict) validates on a dozen seeds at temperature 1, and
  `json_object` is a JSON object;
- at the edges (docs/SERVER.md "Strict schemas", "Control tokens", "Limits"): a strict schema
  with an open object is a 400 naming its path (response_format and a strict tool); a call cut
  by `max_tokens` leaves no markup in `content` and is not returned, streamed or not; control
  tokens the model samples are not in `content`; `max_tokens` past the context is a 400
  naming `max_tokens` (chat and legacy completions).

Starts and stops its own server on 127.0.0.1 (an ephemeral port), every wait bounded.
Run: python3 tools/clients/test_openai.py  (K3_BIN=path/to/k3 to pick the binary; needs
`pip install openai jsonschema`).
"""

import json
import sys
import unittest

import jsonschema
import openai

from _k3_server import (KEY, OPEN_NOTE, REQUEST_TIMEOUT_S, WEATHER_PARAMS, Server,
                        control_spellings, spelling_in)

SERVER = None

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": WEATHER_PARAMS}}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
               "required": ["zone"], "additionalProperties": False}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def client():
    return openai.OpenAI(base_url=SERVER.base + "/v1", api_key=KEY, max_retries=0,
                         timeout=REQUEST_TIMEOUT_S)


def ask_tools(seed, tool_choice, **kwargs):
    args = dict(model="tiny-k3", messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL],
                tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=400,
                temperature=1, seed=seed)
    args.update(kwargs)
    return client().chat.completions.create(**args)


class ToolCalls(unittest.TestCase):
    def check_calls(self, choice):
        self.assertEqual(choice.finish_reason, "tool_calls", choice)
        calls = choice.message.tool_calls
        self.assertEqual(len(calls), 1, choice)  # parallel_tool_calls=False
        call = calls[0]
        self.assertTrue(call.id.startswith("call_"), call)
        self.assertEqual(call.type, "function")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        return call

    def test_required_returns_valid_calls(self):
        for seed in range(1, 5):
            with self.subTest(seed=seed):
                self.check_calls(ask_tools(seed, "required").choices[0])

    def test_a_named_function_is_the_one_called(self):
        named = {"type": "function", "function": {"name": "get_time"}}
        for seed in range(1, 4):
            with self.subTest(seed=seed):
                call = self.check_calls(ask_tools(seed, named).choices[0])
                self.assertEqual(call.function.name, "get_time")

    def test_streamed_deltas_reassemble_to_the_same_valid_call(self):
        whole = self.check_calls(ask_tools(9, "required").choices[0])
        stream = ask_tools(9, "required", stream=True)
        ids, name, arguments, finish = [], None, "", None
        for chunk in stream:
            c = chunk.choices[0]
            for d in c.delta.tool_calls or []:
                self.assertEqual(d.index, 0)
                if d.id:
                    ids.append(d.id)
                    name = d.function.name
                arguments += d.function.arguments or ""
            finish = c.finish_reason or finish
        self.assertEqual(len(ids), 1, ids)
        self.assertEqual(finish, "tool_calls")
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        self.assertEqual((name, arguments), (whole.function.name, whole.function.arguments))

    def test_a_follow_up_with_the_tool_message_is_answered(self):
        first = ask_tools(3, "required").choices[0]
        call = self.check_calls(first)
        history = ASK + [
            first.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Rain, 12 C"},
        ]
        answer = client().chat.completions.create(
            model="tiny-k3", messages=history, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=16)
        self.assertIn(answer.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        self.assertGreater(answer.usage.prompt_tokens, 0)
        changed = client().chat.completions.create(
            model="tiny-k3", messages=history[:-1] + [dict(history[-1], content="Sun")],
            tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=1, logprobs=True, top_logprobs=3)
        again = client().chat.completions.create(
            model="tiny-k3", messages=history, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=1,
            logprobs=True, top_logprobs=3)
        # The tool's result reaches the model: another result, another distribution.
        self.assertNotEqual(changed.choices[0].logprobs.content[0].model_dump(),
                            again.choices[0].logprobs.content[0].model_dump())


CARD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "score": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["name", "tags", "score"], "additionalProperties": False}


class StructuredOutput(unittest.TestCase):
    def test_json_schema_validates_on_a_dozen_seeds(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "card", "strict": True,
                                                      "schema": CARD}}
        for seed in range(12):
            with self.subTest(seed=seed):
                r = client().chat.completions.create(
                    model="tiny-k3", messages=[{"role": "user", "content": "A card"}],
                    response_format=fmt, max_tokens=300, temperature=1, seed=seed)
                self.assertEqual(r.choices[0].finish_reason, "stop")
                jsonschema.validate(json.loads(r.choices[0].message.content), CARD)

    def test_json_object_is_an_object(self):
        r = client().chat.completions.create(
            model="tiny-k3", messages=[{"role": "user", "content": "Any"}],
            response_format={"type": "json_object"}, max_tokens=200, temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)


SPELLINGS = control_spellings()


def streamed(stream):
    """(content pieces, calls as {index: [name, arguments]}, finish_reason) of a stream."""
    pieces, calls, finish = [], {}, None
    for chunk in stream:
        c = chunk.choices[0]
        if c.delta.content:
            pieces.append(c.delta.content)
        for d in c.delta.tool_calls or []:
            call = calls.setdefault(d.index, [None, ""])
            call[0] = call[0] or d.function.name
            call[1] += d.function.arguments or ""
        finish = c.finish_reason or finish
    return pieces, calls, finish


class Edges(unittest.TestCase):
    def test_a_strict_schema_with_an_open_object_is_refused_by_its_path(self):
        fmt = {"type": "json_schema",
               "json_schema": {"name": "note", "strict": True, "schema": OPEN_NOTE}}
        with self.assertRaises(openai.BadRequestError) as caught:
            client().chat.completions.create(
                model="tiny-k3", messages=[{"role": "user", "content": "A note"}],
                response_format=fmt, max_tokens=128, temperature=1, seed=4)
        self.assertEqual(caught.exception.param, "response_format.json_schema.schema")
        self.assertIn("additionalProperties", caught.exception.message)
        tool = {"type": "function", "function": {"name": "note", "strict": True,
                                                 "parameters": OPEN_NOTE}}
        with self.assertRaises(openai.BadRequestError) as caught:
            client().chat.completions.create(
                model="tiny-k3", messages=ASK, tools=[tool], max_tokens=8)
        self.assertEqual(caught.exception.param, "tools[0].function.parameters")

    def test_a_call_cut_by_max_tokens_leaves_no_markup_and_is_not_returned(self):
        cut = 0
        for max_tokens in range(40, 97, 8):
            with self.subTest(max_tokens=max_tokens):
                whole = ask_tools(6, "required", max_tokens=max_tokens).choices[0]
                self.assertIsNone(spelling_in(whole.message.content, SPELLINGS), whole)
                calls = whole.message.tool_calls or []
                for call in calls:
                    jsonschema.validate(json.loads(call.function.arguments),
                                        SCHEMAS[call.function.name])
                self.assertIn(whole.finish_reason, ("length", "tool_calls"))
                cut += not calls
                pieces, scalls, finish = streamed(
                    ask_tools(6, "required", max_tokens=max_tokens, stream=True))
                for piece in pieces:
                    self.assertIsNone(spelling_in(piece, SPELLINGS), pieces)
                self.assertEqual(finish, whole.finish_reason)
                self.assertEqual([tuple(scalls[i]) for i in sorted(scalls)],
                                 [(c.function.name, c.function.arguments) for c in calls])
        self.assertGreater(cut, 0, "some max_tokens cut the call")

    def test_control_tokens_are_not_in_the_content(self):
        sampled = 0
        for seed in range(4):
            with self.subTest(seed=seed):
                args = dict(model="tiny-k3", messages=[{"role": "user", "content": "Hi"}],
                            max_tokens=48, temperature=1, seed=seed,
                            extra_body={"return_tokens": True, "ignore_eos": True})
                r = client().chat.completions.create(**args).choices[0]
                self.assertIsNone(spelling_in(r.message.content, SPELLINGS), r.message)
                sampled += any(i >= 768 for i in r.model_dump()["tokens"])  # added ids
                pieces, _, _ = streamed(client().chat.completions.create(stream=True, **args))
                self.assertEqual("".join(pieces), r.message.content)
        self.assertGreater(sampled, 0, "the tiny model sampled control tokens")

    def test_max_tokens_past_the_context_is_refused(self):
        for stream in (False, True):
            with self.assertRaises(openai.BadRequestError) as caught:
                client().chat.completions.create(
                    model="tiny-k3", messages=ASK, max_tokens=10**9, stream=stream)
            e = caught.exception
            self.assertEqual((e.param, e.code), ("max_tokens", "context_length_exceeded"))
            self.assertIn("maximum context length is 4096 tokens", e.message)
            self.assertIn("in the prompt", e.message)
            with self.assertRaises(openai.BadRequestError) as caught:
                client().completions.create(model="tiny-k3", prompt="Hi", max_tokens=10**9,
                                            stream=stream)
            self.assertEqual(caught.exception.param, "max_tokens")


if __name__ == "__main__":
    SERVER = Server()
    try:
        result = unittest.main(exit=False, verbosity=2).result
    finally:
        SERVER.stop()
    sys.exit(0 if result.wasSuccessful() else 1)
