#!/usr/bin/env python3
"""An agent loop through `k3 serve` (docs/SERVER.md "Tools"): the official `openai` client
offers the model a local Python function; each tool call the model makes is run here and
its result sent back as a `tool` message, until the model answers in text.

    python3 tools/clients/agent_loop.py                      # starts k3 serve fixtures/tiny-k3
    python3 tools/clients/agent_loop.py --base-url http://127.0.0.1:8080/v1 --auto

Without --base-url it starts its own server on the bundled tiny model, whose weights are
random: it would never choose a tool by itself, so the first turn uses
`tool_choice="required"` (constrained decoding makes the call valid); --auto leaves every
turn to the model, as a real model is used. Exits 1 unless a tool ran and a text answer came.
"""

import argparse
import json
import sys

import openai

from _k3_server import KEY, REQUEST_TIMEOUT_S, WEATHER_PARAMS, Server

MAX_TURNS = 4


def get_weather(city, days):
    """The local tool: a made-up forecast."""
    return json.dumps({"city": city, "forecast": ["rain", "sun"] * days})


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city, for 1 to 7 days",
    "parameters": WEATHER_PARAMS}}]
LOCAL = {"get_weather": get_weather}


def run(client, model, auto):
    messages = [{"role": "user", "content": "What will the weather be in Oslo for 2 days?"}]
    ran = 0
    for turn in range(MAX_TURNS + 1):
        if turn == MAX_TURNS:
            choice = "none"  # enough tools: answer now
        elif turn == 0 and not auto:
            choice = "required"
        else:
            choice = "auto"
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=choice,
            parallel_tool_calls=False, max_tokens=300, temperature=1, seed=turn)
        message = reply.choices[0].message
        if not message.tool_calls:
            print(f"answer ({reply.choices[0].finish_reason}): {message.content!r}")
            return ran
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            result = LOCAL[call.function.name](**args)
            print(f"turn {turn}: {call.function.name}({args}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            ran += 1
    return ran


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", help="a running server's /v1 URL (default: start one)")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default="tiny-k3")
    p.add_argument("--auto", action="store_true", help="tool_choice auto on every turn")
    a = p.parse_args()
    server = None
    if a.base_url is None:
        server = Server()
        a.base_url, a.api_key = server.base + "/v1", KEY
    try:
        client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0,
                               timeout=REQUEST_TIMEOUT_S)
        ran = run(client, a.model, a.auto)
    finally:
        if server:
            server.stop()
    if ran == 0 and not a.auto:
        sys.exit("no tool ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
