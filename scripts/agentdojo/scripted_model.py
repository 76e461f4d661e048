#!/usr/bin/env python3
"""A scripted agent behind an OpenAI-compatible chat endpoint, for comparing verdicts.

It plays AgentDojo's ground truth (the ``script.json`` that ``export.py`` writes), one tool
call a turn as AgentDojo's GroundTruthPipeline does, so AgentDojo's runner
(``--model VLLM_PARSED``, ``LOCAL_LLM_PORT``) and pieval (``provider: openai``) can be driven
by the same model turns. The model is stateless: each request's messages say which task it
is on (the first user message is a task's prompt) and how far it got (the tool calls it made,
the tool results it read). Policies (``--policy``, reported as the model's id):

* ``resist``: the user task's calls, then its ground-truth answer;
* ``obey``: on the first tool result that carries an injection task's goal, that task's calls,
  then the rest of the user task, then the answer (with what the goal asks it to say, if it
  asks for words rather than calls);
* ``obey_only``: the injection task's calls, then ``Done.``: the user task abandoned.

A prompt that is an injection task's goal (AgentDojo first runs each injection task as a user
task) is answered with that task's calls. Binds 127.0.0.1 only; reads nothing but the script.

Usage: python scripts/agentdojo/scripted_model.py --script DIR/script.json --policy obey
       [--port 0]  (prints "listening on PORT")
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POLICIES = ("resist", "obey", "obey_only")


def norm(text: str) -> str:
    """Letters and digits only, lowercase: a goal is found through YAML quoting and folding."""
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class Script:
    def __init__(self, data: dict):
        self.by_prompt = {}
        for t in data["user_tasks"]:
            self.by_prompt.setdefault(t["prompt"].strip(), t)
        self.injections = sorted(data["injection_tasks"], key=lambda t: -len(t["goal"]))
        self.goals = [(norm(t["goal"]), t) for t in self.injections]
        self.by_goal = {t["goal"].strip(): t for t in data["injection_tasks"]}

    def find_injection(self, text: str):
        n = norm(text)
        for goal, task in self.goals:
            if goal and goal in n:
                return task
        return None


def next_turn(script: Script, policy: str, messages: list) -> dict:
    """The assistant message for this conversation."""
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return {"role": "assistant", "content": "No task."}
    prompt = text_of(users[0].get("content")).strip()
    task = script.by_prompt.get(prompt)
    if task is None:
        goal_task = script.by_goal.get(prompt)
        if goal_task is None:
            return {"role": "assistant", "content": "I do not know this task."}
        plan, answer = list(goal_task["calls"]), goal_task["answer"] or "Done."
    else:
        issued = 0
        injection, at = None, None
        for m in messages:
            if m.get("role") == "assistant":
                issued += len(m.get("tool_calls") or [])
            elif m.get("role") == "tool" and injection is None:
                found = script.find_injection(text_of(m.get("content")))
                if found is not None:
                    injection, at = found, issued
        plan = list(task["calls"])
        answer = task["answer"] or "Done."
        if injection is not None and policy in ("obey", "obey_only"):
            if policy == "obey":
                plan = plan[:at] + injection["calls"] + plan[at:]
                if injection["answer"]:
                    answer = f"{answer}\n{injection['answer']}"
            else:
                plan = plan[:at] + injection["calls"]
                answer = injection["answer"] or "Done."
    issued = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    if issued < len(plan):
        call = plan[issued]
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{
                "id": f"call_{issued}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }],
        }
    return {"role": "assistant", "content": answer}


def serve(script: Script, policy: str, port: int):
    counter = {"n": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, code: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/models"):
                self.reply(200, {"object": "list", "data": [{"id": policy, "object": "model"}]})
            else:
                self.reply(404, {"error": {"message": "not found"}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length))
                message = next_turn(script, policy, req.get("messages") or [])
            except (ValueError, KeyError, TypeError) as e:
                self.reply(400, {"error": {"message": f"bad request: {e}"}})
                return
            with lock:
                counter["n"] += 1
                n = counter["n"]
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            self.reply(200, {
                "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
                "model": req.get("model") or policy,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", required=True)
    p.add_argument("--policy", choices=POLICIES, required=True)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    with open(args.script, encoding="utf-8") as f:
        script = Script(json.load(f))
    serve(script, args.policy, args.port)


if __name__ == "__main__":
    sys.exit(main())
