#!/usr/bin/env python3
"""Checks a trace written by `gradlanectl trace` (docs/operations.md, "Trace format").

    check_trace.py TRACE.json [--iterations N] [--peers P]

Valid when:
  * it is JSON with a "traceEvents" list (Chrome trace event format) and "otherData";
  * complete ("X") events appear in non-decreasing time order, with dur >= 0;
  * on every thread (lane), spans are properly nested: each span either starts after the
    previous one ended or lies entirely inside the innermost open span;
  * every segment span has exactly two children, "queue" then "wire": the queue starts with the
    segment, the wire ends with it, and the queue ends no later than the wire starts;
  * there are exactly N iteration spans, of consecutive iterations, and every segment, post and
    aggregation span belongs to one of them; segments go to peers 0..P (both directions present);
  * nothing was dropped or left incomplete.
Exit 0 when valid; otherwise prints every problem found and exits 1.
"""
import argparse
import json
import sys

EPS = 0.002  # microseconds: ts/dur are ns-resolution decimals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--peers", type=int, default=None)
    a = ap.parse_args()
    problems = []

    def bad(msg):
        if len(problems) < 20:
            problems.append(msg)

    try:
        with open(a.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_trace: {a.trace}: not valid JSON: {e}")
        return 1
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        print("check_trace: no traceEvents list")
        return 1
    other = doc.get("otherData", {})
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    if not xs:
        print("check_trace: no complete (X) events")
        return 1
    for e in events:
        if e.get("ph") not in ("X", "M"):
            bad(f"unexpected phase {e.get('ph')!r}")
    last_ts = None
    for e in xs:
        for k in ("name", "cat", "ts", "dur", "pid", "tid"):
            if k not in e:
                bad(f"event without {k}: {e}")
        if e["dur"] < 0:
            bad(f"negative duration: {e}")
        if last_ts is not None and e["ts"] < last_ts:
            bad(f"out of order: ts {e['ts']} after {last_ts}")
        last_ts = e["ts"]

    # Nesting per lane, and each segment's children.
    stacks = {}
    children = {}
    for i, e in enumerate(xs):
        end = e["ts"] + e["dur"]
        st = stacks.setdefault((e["pid"], e["tid"]), [])
        while st and xs[st[-1]]["ts"] + xs[st[-1]]["dur"] <= e["ts"] + EPS and not (
            # a zero-length span at the parent's start is still inside it
            e["dur"] == 0 and abs(xs[st[-1]]["ts"] - e["ts"]) <= EPS
        ):
            st.pop()
        if st:
            p = xs[st[-1]]
            if e["ts"] < p["ts"] - EPS or end > p["ts"] + p["dur"] + EPS:
                bad(f"span {e['name']}@{e['ts']}+{e['dur']} overlaps {p['name']}@{p['ts']}+{p['dur']} "
                    f"on tid {e['tid']} without nesting")
            children.setdefault(st[-1], []).append(i)
        st.append(i)

    segs = [i for i, e in enumerate(xs) if e["cat"] == "segment"]
    for i in segs:
        s = xs[i]
        kids = [xs[k] for k in children.get(i, [])]
        if [k["name"] for k in kids] != ["queue", "wire"]:
            bad(f"segment {s['name']}@{s['ts']}: children {[k['name'] for k in kids]}, want queue, wire")
            continue
        q, w = kids
        if abs(q["ts"] - s["ts"]) > EPS:
            bad(f"segment {s['name']}: queue does not start with the segment")
        if abs(w["ts"] + w["dur"] - (s["ts"] + s["dur"])) > EPS:
            bad(f"segment {s['name']}: wire does not end with the segment")
        if q["ts"] + q["dur"] > w["ts"] + EPS:
            bad(f"segment {s['name']}: queue ends after the wire starts")
    for i, e in enumerate(xs):
        if e["cat"] in ("queue", "wire") and not any(i in children.get(j, []) for j in segs):
            pass  # checked from the parent side; orphans show up as a parent without children
    for parent, kids in children.items():
        if xs[parent]["cat"] != "segment" and kids:
            bad(f"{xs[parent]['cat']} span {xs[parent]['name']} has children")

    its = sorted(e["args"]["iteration"] for e in xs if e["cat"] == "iteration")
    if a.iterations is not None and len(its) != a.iterations:
        bad(f"{len(its)} iteration spans, want {a.iterations}")
    if its and its != list(range(its[0], its[0] + len(its))):
        bad(f"iterations not consecutive: {its}")
    window = set(its)
    dirs = set()
    for e in xs:
        if e["cat"] in ("segment", "post", "aggregation"):
            if e["args"].get("iteration") not in window:
                bad(f"{e['cat']} {e['name']} of iteration {e['args'].get('iteration')} outside {its}")
        if e["cat"] == "segment":
            dirs.add(e["args"]["direction"])
            if a.peers is not None and not 0 <= e["args"]["peer"] <= a.peers:
                bad(f"segment to peer {e['args']['peer']}")
    counts = {c: sum(1 for e in xs if e["cat"] == c) for c in ("segment", "post", "aggregation", "iteration")}
    if counts["segment"] == 0 or counts["post"] == 0 or counts["aggregation"] == 0:
        bad(f"missing span kinds: {counts}")
    if dirs != {"push", "pull"}:
        bad(f"segment directions {sorted(dirs)}, want push and pull")
    if other.get("spans_dropped", 0) != 0 or other.get("spans_incomplete", 0) != 0:
        bad(f"dropped/incomplete spans: {other}")

    if problems:
        print(f"check_trace: {a.trace}: {len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    lanes = len(stacks)
    print(f"check_trace: {a.trace}: ok — {len(xs)} spans on {lanes} lanes: {counts}, "
          f"iterations {its[0] if its else '-'}..{its[-1] if its else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
