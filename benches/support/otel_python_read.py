"""The trace-import bench's peer (benches/trace_import.rs): the collector's length-prefixed
protobuf file decoded with the OpenTelemetry Python SDK's generated classes
(opentelemetry-proto) and the tool calls grouped per case — the loop a team writes today
to read its agent's actions from traces. Prints the counts.

Usage: python otel_python_read.py FILE
"""

import sys
from collections import defaultdict

from opentelemetry.proto.trace.v1.trace_pb2 import TracesData


def value(v):
    k = v.WhichOneof("value")
    return getattr(v, k) if k else None


def main():
    data = open(sys.argv[1], "rb").read()
    at, spans = 0, 0
    cases = {}
    calls = defaultdict(list)
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        msg = TracesData.FromString(data[at + 4:at + 4 + n])
        at += 4 + n
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans += 1
                    attrs = {kv.key: value(kv.value) for kv in s.attributes}
                    if "pieval.case_id" in attrs:
                        cases[s.trace_id] = attrs["pieval.case_id"]
                    if attrs.get("gen_ai.operation.name") == "execute_tool":
                        calls[s.trace_id].append((s.start_time_unix_nano, attrs.get("gen_ai.tool.name"),
                                                  attrs.get("gen_ai.tool.call.arguments")))
    per_case = {cases.get(t): sorted(c) for t, c in calls.items()}
    print(f"{spans} spans, {len(per_case)} cases, {sum(len(c) for c in per_case.values())} calls")


if __name__ == "__main__":
    main()
