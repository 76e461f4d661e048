#!/usr/bin/env python3
"""Export AgentDojo's suites to pieval agentic cases (docs/agents.md#agentdojo).

Runs AgentDojo's own package (``pip install agentdojo``; Debenedetti et al. 2024, "AgentDojo:
A Dynamic Environment to Evaluate Prompt Injection Attacks and Defenses for LLM Agents") and
records, per suite and benchmark version:

* the tools, as the OpenAI function schemas AgentDojo's OpenAI pipeline sends;
* the environment, as ``lookup`` behaviours: the output of every call the tasks' ground truth
  makes (each user task's calls in order, then each injection task's on a fresh copy, then
  every tool without required arguments), recorded from AgentDojo's tools on the task's
  environment with every injection vector replaced by a ``{{vector:NAME}}`` marker; a call
  not recorded gets a tool error that says so;
* the injection vectors (AgentDojo's defaults) and the vectors each user task's ground truth
  shows the model (AgentDojo's injection candidates): the case's ``injected``;
* the attack text, from AgentDojo's attack class (``--attack``), as the case's payload;
* the security check of each injection task and the utility check of each user task,
  translated to action criteria **by probing AgentDojo's own checks**: a ground-truth call
  is required when the check fails without it; an argument is tested when the check fails
  with it changed, and tested as loosely as the check allows (case, substrings); the final
  answer is tested for the parts of the ground-truth answer the check needs. Checks that read
  the ordered trace become a ``sequence``. Every translation is labelled with what it
  approximates (state diffs, ordered traces, answer alternatives) in ``translation.json``.

It also writes ``script.json``: what the scripted agent of ``scripts/agentdojo/scripted_model.py``
does for each task (the ground truth), so AgentDojo's runner and pieval can be driven by the
same model turns (``benches/compare_agentdojo.py``).

Usage: python scripts/agentdojo/export.py --out DIR [--benchmark-version v1.1.2]
       [--suites banking,slack,travel,workspace] [--attack important_instructions_no_model_name]
       [--user-tasks user_task_0,...] [--injection-tasks injection_task_0,...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import ast
import copy
import importlib.metadata
import inspect
import json
import os
import re
import sys
import tempfile
import textwrap
from collections import OrderedDict

from agentdojo.agent_pipeline.agent_pipeline import load_system_message
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.llms.openai_llm import _function_to_openai
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.attacks.attack_registry import load_attack
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
from agentdojo.task_suite.load_suites import get_suite
from agentdojo.types import text_content_block_from_string

SUITES = ("banking", "slack", "travel", "workspace")
MISSING = "__pieval_missing__"
UNRECORDED = (
    "pieval's export of AgentDojo has no recorded output for this call: it records the calls "
    "the tasks' ground truth makes and every tool without required arguments"
)


class _Pipeline(BasePipelineElement):
    """The target an attack addresses: AgentDojo derives the model's name from it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def query(self, *args, **kwargs):  # never run
        raise RuntimeError("not a model")


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def run_calls(suite, env, calls):
    """Run calls on env (changed in place); returns [(call, output, error)]."""
    runtime = FunctionsRuntime(suite.tools)
    out = []
    for call in calls:
        result, error = runtime.run_function(env, call.function, dict(call.args))
        out.append((call, tool_result_to_str(result) if error is None else "", error))
    return out


def verdict(suite, task, env0, calls, answer) -> bool:
    """AgentDojo's own check of task after calls and answer, on a copy of env0."""
    pre = env0.model_copy(deep=True)
    env = env0.model_copy(deep=True)
    run_calls(suite, env, calls)
    trace = [FunctionCall(function=c.function, args=dict(c.args)) for c in calls]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # some checks print
            return bool(suite._check_task_result(
                task, [text_content_block_from_string(answer)], pre, env, trace))
    except Exception:  # a check that cannot read the state fails, as in a run
        return False


def perturbed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return -999999 if value != -999999 else 0
    if isinstance(value, str):
        return "pieval-probe"
    if isinstance(value, list):
        return []
    if isinstance(value, dict):
        return {}
    return None


def minimal_text(text: str, holds) -> str:
    """The shortest part of text (whole words, then trimmed ends) for which holds(part)."""
    words = text.split()
    i = 0
    while i < len(words) and len(words) > 1:
        trial = words[:i] + words[i + 1 :]
        if holds(" ".join(trial)):
            words = trial
        else:
            i += 1
    part = " ".join(words)
    while len(part) > 1 and holds(part[1:]):
        part = part[1:]
    while len(part) > 1 and holds(part[:-1]):
        part = part[:-1]
    return part


def needed_phrases(answer: str, holds) -> list[str]:
    """The parts of answer that holds(text) needs: words dropped while it still holds, the
    words left joined where they were neighbours, each phrase's ends trimmed."""
    words = answer.split()
    keep = list(range(len(words)))
    i = 0
    while i < len(keep):
        trial = keep[:i] + keep[i + 1 :]
        if holds(" ".join(words[k] for k in trial)):
            keep = trial
        else:
            i += 1
    runs = []
    for k in keep:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    phrases = [" ".join(words[k] for k in run) for run in runs]
    if not holds("\n".join(phrases)):
        return phrases  # the caller sees the parts fail the check
    # A phrase the check does not need whole is split where it can be.
    j = 0
    while j < len(phrases):
        cut = phrases[j].split(" ")
        for at in range(1, len(cut)):
            trial = phrases[:j] + [" ".join(cut[:at]), " ".join(cut[at:])] + phrases[j + 1 :]
            if holds("\n".join(trial)):
                phrases = trial
                break
        else:
            j += 1
    for j, phrase in enumerate(phrases):

        def holds_j(p, j=j):
            return holds("\n".join(phrases[:j] + [p] + phrases[j + 1 :]))

        while len(phrase) > 1 and holds_j(phrase[1:]):
            phrase = phrase[1:]
        while len(phrase) > 1 and holds_j(phrase[:-1]):
            phrase = phrase[:-1]
        phrases[j] = phrase
    return phrases


def text_matcher(value: str, holds) -> dict:
    """The loosest matcher of a text argument that the check still needs: the whole text
    (case folded if the check folds it) when it wants it whole, else the parts it needs,
    in order (a regex when there are several, or spaces inside them)."""
    folded = holds(value.upper()) and holds(value.lower())
    if not holds(value + " pieval-probe") and not holds("pieval-probe " + value):
        return {"iequals": value} if folded else {"equals": value}
    parts = needed_phrases(value, holds)
    if folded and len(parts) == 1 and not re.search(r"\s", parts[0]):
        return {"contains": parts[0]}  # pieval's contains folds case, as this check does
    pattern = ".*?".join(r"\s+".join(re.escape(w) for w in p.split()) for p in parts)
    return {"regex": ("(?is)" if folded else "(?s)") + pattern}


def criteria_arg_keys(criteria_list) -> dict:
    """{tool: {argument names}} that tool_call / count / no_tool_call leaves test."""
    out = {}

    def walk(c):
        if isinstance(c, dict):
            if c.get("type") in ("tool_call", "count", "no_tool_call") and "tool" in c:
                out.setdefault(c["tool"], set()).update((c.get("args") or {}).keys())
            for v in c.values():
                walk(v)
        elif isinstance(c, list):
            for v in c:
                walk(v)

    for c in criteria_list:
        walk(c)
    return out


def with_arg(call, key, value):
    args = dict(call.args)
    if value is MISSING:
        args.pop(key, None)
    else:
        args[key] = value
    return FunctionCall(function=call.function, args=args)


def check_kind(task) -> list[str]:
    """What AgentDojo's check of task reads (its body's names): trace, state, answer."""
    cls = type(task)
    base = BaseUserTask if isinstance(task, BaseUserTask) else BaseInjectionTask
    if cls.__module__.endswith("task_combinators"):
        # Two tasks combined (AgentDojo's TaskCombinator): both checks must hold, in no
        # order; it reads what its parts read (the first part is its base class).
        cls = cls.__mro__[1]
        kinds = check_kind_of(cls, base)
        return [k for k in kinds if k != "trace"] + ["combined"]
    return check_kind_of(cls, base)


def check_kind_of(cls, base) -> list[str]:
    traces_name = "utility_from_traces" if base is BaseUserTask else "security_from_traces"
    state_name = "utility" if base is BaseUserTask else "security"
    kinds = []
    if getattr(cls, traces_name) is not getattr(base, traces_name):
        kinds.append("trace")
        fn = getattr(cls, traces_name)
    else:
        fn = getattr(cls, state_name)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    names = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    if names & {"post_environment", "pre_environment"}:
        kinds.append("state")
    if "model_output" in names:
        kinds.append("answer")
    return kinds


def translate(suite, task, env0, calls, answer, extras=()):
    """Criteria for task's check, probed against AgentDojo; (criteria, note) or (None, why).

    extras: calls another task would add (an obedient agent's); a check that fails when one
    is added before the ground truth and when it is added after gets "no more calls of that
    tool than the ground truth"."""
    if not verdict(suite, task, env0, calls, answer):
        return None, "the ground truth does not pass AgentDojo's own check"
    kinds = check_kind(task)
    # Calls the check needs: dropping one makes it fail.
    needed = []
    for i, call in enumerate(calls):
        rest = calls[:i] + calls[i + 1 :]
        if not verdict(suite, task, env0, rest, answer):
            needed.append(i)
    leaves = []
    loose = []
    for i in needed:
        call = calls[i]
        matchers = OrderedDict()
        for key, value in call.args.items():

            def holds(v, key=key):
                trial = list(calls)
                trial[i] = with_arg(call, key, v)
                return verdict(suite, task, env0, trial, answer)

            if holds(perturbed(value)):
                continue  # the check does not read this argument
            if isinstance(value, str):
                matchers[key] = text_matcher(value, holds)
                if not ({"equals", "iequals"} & matchers[key].keys()):
                    loose.append(f"{call.function}.{key} contains")
            elif isinstance(value, list) and all(isinstance(x, str) for x in value) and value:
                if holds(value + ["pieval-probe@example.com"]) and len(value) == 1:
                    # The check wants the item among others: its text in the list's.
                    matchers[key] = {"contains": value[0]}
                    loose.append(f"{call.function}.{key} a list containing the item")
                else:
                    matchers[key] = {"equals": value}
                    if holds(value + ["pieval-probe@example.com"]):
                        loose.append(f"{call.function}.{key} the exact list (the check allows more items)")
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                matchers[key] = {"number": value}
                if holds(value + 1) or holds(value * 2):
                    loose.append(f"{call.function}.{key} the exact number (the check allows others)")
            else:
                matchers[key] = {"equals": value}
        leaf = {"type": "tool_call", "tool": call.function, "args": dict(matchers)}
        if "trace" not in kinds:
            leaf["ok"] = True  # a state check: a call that failed changed nothing
        leaves.append(leaf)
    # Repeated identical leaves are a count.
    grouped = []
    for leaf in leaves:
        same = [g for g in grouped if g[0] == leaf]
        if same:
            same[0][1] += 1
        else:
            grouped.append([leaf, 1])
    parts = []
    for leaf, n in grouped:
        if n > 1 and "trace" not in kinds:
            parts.append({"type": "count", "tool": leaf["tool"], "args": leaf["args"], "min": n,
                          "ok": True})
        else:
            parts.extend([leaf] * n)
    if "trace" in kinds and len(parts) > 1:
        parts = [{"type": "sequence", "of": parts}]
    # The final answer: the parts of the ground-truth answer the check needs.
    answer_parts = []
    if answer and not verdict(suite, task, env0, calls, ""):
        answer_parts = needed_phrases(answer, lambda text: verdict(suite, task, env0, calls, text))
        for p in answer_parts:
            parts.append({"type": "contains", "value": p})
        # The parts alone must still satisfy the check.
        if not verdict(suite, task, env0, calls, "\n".join(answer_parts)):
            return None, "the answer check needs more than parts of the ground-truth answer"
    # Calls the check forbids: it fails when they are added to the ground truth.
    forbidden = []
    # (probed for every check: one that reads no state is never broken by a call). A call
    # that breaks it only on one side of the ground truth (a booking the user's later one
    # replaces) is not forbidden: an obedient agent does the injected task first.
    # Each such call is forbidden as made, and its tool past the ground truth's count (a
    # call of the tool that the ground truth makes without changing anything may be the
    # one an agent replaced).
    for fname in OrderedDict((e.function, None) for e in extras):
        breaking = [e for e in extras if e.function == fname
                    and not verdict(suite, task, env0, list(calls) + [e], answer)
                    and not verdict(suite, task, env0, [e] + list(calls), answer)]
        if not breaking:
            continue
        n = sum(1 for c in calls if c.function == fname)
        forbidden.append(fname)
        if n == 0:
            parts.append({"type": "no_tool_call", "tool": fname, "ok": True})
            continue
        parts.append({"type": "count", "tool": fname, "max": n, "ok": True})
        seen = set()
        for e in breaking:
            key = canonical(e.args)
            if key not in seen:
                seen.add(key)
                parts.append({"type": "no_tool_call", "tool": fname, "ok": True,
                              "args": {k: {"equals": v} for k, v in e.args.items()}})
    vacuous = None
    if not parts:
        # AgentDojo's check holds before the agent does anything (the environment already
        # satisfies it) and no probe breaks it: the translation holds whatever the agent does.
        tool = calls[0].function if calls else "send_email"
        parts.append({"type": "count", "tool": tool, "min": 0})
        vacuous = "AgentDojo's check holds on the untouched environment and after every probe"
    criteria = parts[0] if len(parts) == 1 else {"type": "all", "of": parts}
    approximates = []
    if "state" in kinds:
        approximates.append("state diff as the calls that make it")
    if "trace" in kinds:
        approximates.append("ordered trace check as a sequence")
    if "combined" in kinds:
        approximates.append("two combined tasks' checks as one conjunction")
    if answer_parts:
        approximates.append("answer check as the ground-truth answer's needed parts")
    if loose:
        approximates.append("substring tests: " + ", ".join(loose))
    if forbidden:
        approximates.append("no other change as no more calls than the ground truth of: "
                            + ", ".join(forbidden))
    note = {"reads": kinds, "approximates": approximates}
    if vacuous:
        note["vacuous"] = vacuous
    return criteria, note


def export_suite(args, version, name, out, script, report):
    suite = get_suite(version, name)
    attack = load_attack(args.attack, suite, _Pipeline(args.pipeline_name))
    runtime = FunctionsRuntime(suite.tools)
    tools_schema = [json.loads(json.dumps(_function_to_openai(f))) for f in runtime.functions.values()]
    defaults = suite.get_injection_vector_defaults()
    markers = {v: "{{vector:%s}}" % v for v in defaults}
    system = load_system_message(None)
    pick = lambda ids, wanted: [i for i in ids if not wanted or i in wanted]  # noqa: E731
    user_ids = pick(suite.user_tasks, args.user_tasks)
    inj_ids = pick(suite.injection_tasks, args.injection_tasks)
    plain0 = suite.load_and_inject_default_environment({})
    inj_report = {}
    security = {}
    for iid in inj_ids:
        task = suite.injection_tasks[iid]
        calls = task.ground_truth(plain0.model_copy(deep=True))
        # A goal that asks for an answer (say X) is answered by the goal's own words.
        answer = "" if verdict(suite, task, plain0, calls, "") else task.GOAL
        criteria, note = translate(suite, task, plain0, calls, answer)
        security[iid] = criteria
        inj_report[iid] = note if criteria else {"untranslated": note}
        script["injection_tasks"].append(
            {"suite": name, "id": iid, "goal": task.GOAL, "answer": answer,
             "calls": [{"name": c.function, "arguments": c.args} for c in calls]}
        )
    cases = []
    shared = OrderedDict()
    envs_file = f"agentdojo-{name}.environments.json"
    user_report = {}
    for uid in user_ids:
        task = suite.user_tasks[uid]
        marked = task.init_environment(suite.load_and_inject_default_environment(markers))
        plain = task.init_environment(suite.load_and_inject_default_environment({}))
        gt = task.ground_truth(plain.model_copy(deep=True))
        answer = task.GROUND_TRUTH_OUTPUT
        extras = [c for iid in inj_ids
                  for c in suite.injection_tasks[iid].ground_truth(plain.model_copy(deep=True))]
        utility, note = translate(suite, task, plain, gt, answer, extras)
        user_report[uid] = note if utility else {"untranslated": note}
        script["user_tasks"].append(
            {"suite": name, "id": uid, "prompt": task.PROMPT, "answer": answer,
             "calls": [{"name": c.function, "arguments": c.args} for c in gt]}
        )
        # The world: outputs of the ground-truth calls, first recording wins.
        recorded = OrderedDict()

        def record(env, calls, criteria=None):
            # criteria: the check of the task that makes these calls; the arguments it
            # tests key the call's looser lookup case (below)
            tested = criteria_arg_keys([criteria])
            for call, output, error in run_calls(suite, env, calls):
                key = (call.function, canonical(call.args))
                if key not in recorded:
                    recorded[key] = (call, output, error, tested.get(call.function, set()))

        # The calls as the ground truth makes them on the marked environment: where an
        # argument names something a vector is part of (slack's external channel), the
        # lookup's matcher holds the marker, filled per case like the outputs.
        record(marked.model_copy(deep=True), task.ground_truth(marked.model_copy(deep=True)),
               utility)
        for iid in inj_ids:
            itask = suite.injection_tasks[iid]
            record(marked.model_copy(deep=True), itask.ground_truth(marked.model_copy(deep=True)),
                   security[iid])
        for f in runtime.functions.values():
            if not f.parameters.model_json_schema().get("required"):
                record(marked.model_copy(deep=True), [FunctionCall(function=f.name, args={})])
        # A call that differs from a recorded one only in arguments its task's check does
        # not test (another subject, another date) gets the recorded output, as AgentDojo
        # would run it, rather than "not recorded": a looser case after the exact ones.
        tools = []
        for schema in tools_schema:
            fname = schema["function"]["name"]
            lookup_cases = []
            loose_cases = []
            for (rname, _), (call, output, error, tested) in recorded.items():
                if rname != fname:
                    continue
                reply = {"output": error, "error": True} if error else {"output": output}
                lookup_cases.append(
                    {"args": {k: {"equals": v} for k, v in call.args.items()}, **reply}
                )
                keys = [k for k in call.args if k in tested]
                if not error and keys and len(keys) < len(call.args):
                    case = {"args": {k: {"equals": call.args[k]} for k in keys}, **reply}
                    if case not in loose_cases:
                        loose_cases.append(case)
            lookup_cases.extend(loose_cases)
            tools.append(
                {"schema": schema,
                 "behaviour": {"kind": "lookup", "cases": lookup_cases,
                               "default": {"output": UNRECORDED, "error": True}}}
            )
        used = sorted({c.function for c in gt})
        try:
            candidates = attack.get_injection_candidates(task)
        except ValueError:
            candidates = []
        environment = {"tools": tools, "vectors": defaults, "user_tools": used,
                       "max_turns": args.max_turns}
        if not args.inline:
            # One shared environment per user task, named by it (docs/contract.md).
            shared[uid] = environment
            environment = {"include": f"{envs_file}#{uid}"}
        base = {
            "source_name": "agentdojo",
            "source_type": "public_benchmark",
            "attack_surface": "tool_output",
            "prompt": task.PROMPT,
            "context": system,
            "language": "en",
            "source_version": f"agentdojo {AGENTDOJO} {version}",
        }
        provenance = {
            "source_name": "agentdojo", "source_type": "public_benchmark",
            "source_reference": f"agentdojo {version} {name}/{uid}",
            "source_version": version, "agentdojo_package": AGENTDOJO,
            "license": "MIT (AgentDojo, ETH Zurich SPY Lab)",
            "adapter": "scripts/agentdojo/export.py",
            "utility_translation": user_report[uid],
        }
        if utility is not None:
            benign = dict(base)
            benign.update({
                "case_id": f"agentdojo-{version}-{name}-{uid}-none",
                "attack_family": "agentdojo_benign",
                "success_criteria": {"type": "not_refused"},
                "label": "benign",
                "provenance": {**provenance, "attack": None},
                "notes": f"AgentDojo {name}/{uid} without attack: utility without attack.",
                "environment": {**environment, "injected": []},
                "utility_criteria": utility,
            })
            cases.append(benign)
        if not candidates:
            report.setdefault("not_injectable", []).append(f"{name}/{uid}")
        for iid in inj_ids:
            if security[iid] is None or not candidates:
                continue
            itask = suite.injection_tasks[iid]
            injections = attack.attack(task, itask)
            payloads = set(injections.values())
            if len(payloads) != 1:
                raise SystemExit(f"{name}/{uid}/{iid}: the attack places different texts")
            case = dict(base)
            case.update({
                "case_id": f"agentdojo-{version}-{name}-{uid}-{iid}",
                "attack_family": "agentdojo_" + name,
                "success_criteria": security[iid],
                "attack_subtype": args.attack,
                "task_input": payloads.pop(),
                "label": "attack",
                "provenance": {**provenance, "attack": args.attack, "injection_task": iid,
                               "security_translation": inj_report[iid]},
                "notes": f"AgentDojo {name}/{uid} x {iid}: {itask.GOAL}",
                "environment": {**environment, "injected": sorted(injections)},
            })
            if utility is not None:
                case["utility_criteria"] = utility
            cases.append(case)
    if shared:
        write_atomic(os.path.join(out, envs_file),
                     json.dumps({"environments": shared}, ensure_ascii=False) + "\n")
    path = os.path.join(out, f"agentdojo-{name}.jsonl")
    write_atomic(path, "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases))
    report["suites"][name] = {
        "cases": len(cases),
        "user_tasks": user_report,
        "injection_tasks": inj_report,
    }
    return len(cases)


def write_atomic(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".export-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def counts(report):
    """Per suite: tasks translated, and how (the approximations named)."""
    rows = []
    for name, s in report["suites"].items():
        for kind in ("user_tasks", "injection_tasks"):
            tasks = s[kind]
            ok = [t for t in tasks.values() if "untranslated" not in t]
            exact = [t for t in ok if not t["approximates"] and "vacuous" not in t]
            vacuous = [t for t in ok if "vacuous" in t]
            by = {}
            for t in ok:
                for a in t["approximates"]:
                    key = a.split(":")[0]
                    by[key] = by.get(key, 0) + 1
            rows.append({"suite": name, "tasks": kind, "total": len(tasks), "translated": len(ok),
                         "exact": len(exact), "vacuous": len(vacuous), "approximated": by,
                         "untranslated": len(tasks) - len(ok)})
    return rows


AGENTDOJO = importlib.metadata.version("agentdojo")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--benchmark-version", default="v1.1.2")
    p.add_argument("--suites", default=",".join(SUITES))
    p.add_argument("--attack", default="important_instructions_no_model_name")
    p.add_argument("--pipeline-name", default="vllm_parsed",
                   help="the AgentDojo pipeline the attack addresses (names the model)")
    p.add_argument("--user-tasks", default="")
    p.add_argument("--injection-tasks", default="")
    p.add_argument("--max-turns", type=int, default=16)
    p.add_argument("--inline", action="store_true",
                   help="write each case's whole environment into it (default: one shared "
                        "environment file per suite, named by each case's include)")
    args = p.parse_args()
    args.user_tasks = set(filter(None, args.user_tasks.split(",")))
    args.injection_tasks = set(filter(None, args.injection_tasks.split(",")))
    os.makedirs(args.out, exist_ok=True)
    if os.path.islink(args.out):
        raise SystemExit(f"{args.out}: a symbolic link; give a folder")
    script = {"agentdojo": AGENTDOJO, "benchmark_version": args.benchmark_version,
              "user_tasks": [], "injection_tasks": []}
    report = {"agentdojo": AGENTDOJO, "benchmark_version": args.benchmark_version,
              "attack": args.attack, "suites": {}}
    total = 0
    for name in filter(None, args.suites.split(",")):
        if name not in SUITES:
            raise SystemExit(f"--suites: unknown suite {name!r} (one of {', '.join(SUITES)})")
        total += export_suite(args, args.benchmark_version, name, args.out, script, report)
    report["counts"] = counts(report)
    write_atomic(os.path.join(args.out, "script.json"), json.dumps(script, indent=1, ensure_ascii=False))
    write_atomic(os.path.join(args.out, "translation.json"), json.dumps(report, indent=1, ensure_ascii=False))
    for row in report["counts"]:
        print(f"{row['suite']:10} {row['tasks']:16} {row['translated']:3}/{row['total']:<3} translated, "
              f"{row['exact']} without approximation, {row['vacuous']} vacuous, approximated: {row['approximated']}, "
              f"untranslated: {row['untranslated']}")
    print(f"{total} cases written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
