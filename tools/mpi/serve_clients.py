#!/usr/bin/env python3
"""Concurrent streaming clients of `k3 serve` (docs/DISTRIBUTED.md#testing), stdlib only.

Usage: serve_clients.py HOST:PORT
Starts three streaming requests at once (two `/v1/completions` with `return_tokens`, one
`/v1/chat/completions` forced to call a tool) and prints, as JSON, what each received: the
streamed text, the ids of the final chunk, the tool call's name and arguments, the finish
reason. Tool call ids are left out (they are fresh per server). The same output from two
servers means they generated the same ids and text.
"""
import http.client
import json
import sys
import threading

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Tokyo"]}, "days": {"type": "integer"}},
    "required": ["city"],
}

REQUESTS = [
    ("/v1/completions", {"prompt": "The train left at", "max_tokens": 16, "temperature": 0.8,
                         "seed": 3, "stream": True, "return_tokens": True}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0,
                         "stream": True, "return_tokens": True}),
    ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 400,
        "temperature": 1, "seed": 7, "stream": True}),
]


def stream(host, port, path, body, out, slot):
    conn = http.client.HTTPConnection(host, port, timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    got = {"status": resp.status, "text": "", "ids": None, "calls": [], "finish": None}
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            got["finish"] = choice.get("finish_reason") or got["finish"]
            if "tokens" in choice:
                got["ids"] = choice["tokens"]
            got["text"] += choice.get("text") or ""
            delta = choice.get("delta") or {}
            got["text"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if fn.get("name"):
                    got["calls"].append([fn["name"], ""])
                if fn.get("arguments") and got["calls"]:
                    got["calls"][-1][1] += fn["arguments"]
    conn.close()
    out[slot] = got


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    out = [None] * len(REQUESTS)
    threads = [threading.Thread(target=stream, args=(host, int(port), path, body, out, i))
               for i, (path, body) in enumerate(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, got in enumerate(out):
        if got is None or got["status"] != 200:
            sys.exit(f"request {i} failed: {got}")
    if not out[0]["ids"] or not out[2]["calls"]:
        sys.exit(f"missing ids or tool call: {out}")
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
