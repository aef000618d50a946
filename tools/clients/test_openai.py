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
  `json_object` is a JSON object.

Starts and stops its own server on 127.0.0.1 (an ephemeral port), every wait bounded.
Run: python3 tools/clients/test_openai.py  (K3_BIN=path/to/k3 to pick the binary; needs
`pip install openai jsonschema`).
"""

import json
import sys
import unittest

import jsonschema
import openai

from _k3_server import KEY, REQUEST_TIMEOUT_S, WEATHER_PARAMS, Server

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


if __name__ == "__main__":
    SERVER = Server()
    try:
        result = unittest.main(exit=False, verbosity=2).result
    finally:
        SERVER.stop()
    sys.exit(0 if result.wasSuccessful() else 1)
