#!/usr/bin/env python3
# bench/transcript.py N FILE: a replay transcript (model-replay's JSON lines) of N shell
# calls of `true`, ten per model answer, then a final answer. Used by bench/run-bench.sh and
# bench/compare.sh for a run's cost per shell call.
import json, sys
n, out = int(sys.argv[1]), sys.argv[2]
with open(out, "w") as f:
    k = 0
    while k < n:
        calls = []
        for _ in range(min(10, n - k)):
            calls.append({"id": "call_%d" % k, "type": "function",
                          "function": {"name": "shell", "arguments": json.dumps({"command": "true"})}})
            k += 1
        f.write(json.dumps({"object": "chat.completion", "model": "gpt-6-luna",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                "tool_calls": calls}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}) + "\n")
    f.write(json.dumps({"object": "chat.completion", "model": "gpt-6-luna",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}) + "\n")
