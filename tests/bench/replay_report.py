#!/usr/bin/env python3
"""tests/bench/replay_report.py — turns tests/bench/run-replay's raw files into its CSV and table.

Not meant to be run by hand: run-replay passes its work directory: a manifest (one line per run:
bandwidth index j, label, bits/s, policy, run directory, ok), the simulator's CSV per bandwidth
(sim.<j>.csv) and, where calibrated, iperf3's per-port bits/s (wire.<j>) with the simulator at
that rate (simwire.<j>.csv). Each run
directory holds the ranks' CSVs (gradlane-replay --csv: iteration,time_ms,stall_ms,warmup,
start_ns) and two counter snapshots (`before`, `after`: "name value" lines).

Iteration time as the simulator defines it (docs/simulator.md): S(k, w) = start of rank w's
forward k, T(k) = max_w S(k+1, w) - max_w S(k, w), averaged over the measured iterations.
Standard library only (python3 is in deploy/install-deps.sh).
"""
import argparse
import csv
import math
import os
import sys

COLUMNS = [
    # the contract (issue #6)
    "policy", "iteration_ms", "speedup_vs_fifo", "ratio_to_ideal", "sim_iteration_ms",
    # the simulator's bound, the emulated network's measured rate and the simulator at it
    "ideal_ms", "vs_sim", "wire_gbit", "sim_at_wire_ms", "ideal_at_wire_ms",
    # the run
    "p10_ms", "p90_ms", "stall_ms", "client_ms", "compute_ms", "rho", "link_mb", "sim_link_mb",
    "link_util_pct", "sendq_kb", "sendq_ms", "recvq_kb", "retrans", "rto", "drops",
    "daemon_cpu_pct", "daemon_wait_pct", "host_busy_pct", "host_kernel_pct", "loadavg",
    # --time-scale K: the times above are as measured (K times the unscaled run's, roughly);
    # these are the same divided by K, and the bandwidth the run stands for (bandwidth_gbit x K)
    "iteration_ms_unscaled", "sim_iteration_ms_unscaled", "ideal_ms_unscaled",
    "p10_ms_unscaled", "p90_ms_unscaled", "stall_ms_unscaled", "client_ms_unscaled",
    "compute_ms_unscaled", "bandwidth_unscaled_gbit",
    # the setting
    "bandwidth_gbit", "bandwidth", "time_scale", "sim_overhead_us", "sim_latency_us",
    "tbf_burst_ms", "workers", "model", "transport", "network",
    "nice", "iterations", "warmup", "status", "mode", "priorities",
]
# Measured (or simulated) times and their *_unscaled column: the time divided by time_scale.
UNSCALED = ["iteration_ms", "sim_iteration_ms", "ideal_ms", "p10_ms", "p90_ms", "stall_ms",
            "client_ms", "compute_ms"]


def read_counters(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        out[parts[0]] = int(parts[1])
                    except ValueError:
                        try:
                            out[parts[0]] = int(float(parts[1]))
                        except ValueError:
                            pass
    except OSError:
        pass
    return out


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def read_rank(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({
                "k": int(r["iteration"]),
                "ms": float(r["time_ms"]),
                "stall": float(r["stall_ms"]),
                "warmup": r["warmup"] == "1",
                "start": int(r["start_ns"]),
            })
    rows.sort(key=lambda x: x["k"])
    return rows


def measure(run_dir, workers, iterations, warmup, bps, clk_tck, compute_ms):
    """Returns the measured columns of one run, or raises ValueError with the reason."""
    ranks = []
    for r in range(workers):
        path = os.path.join(run_dir, "rank%d.csv" % r)
        if not os.path.exists(path):
            raise ValueError("rank %d wrote no CSV" % r)
        rows = read_rank(path)
        if len(rows) != warmup + iterations:
            raise ValueError("rank %d has %d iterations, expected %d" %
                             (r, len(rows), warmup + iterations))
        # S(k) for k = 0..n; the closing forward start is the last start plus its time.
        starts = [x["start"] for x in rows] + [rows[-1]["start"] + round(rows[-1]["ms"] * 1e6)]
        ranks.append((rows, starts))
    n = warmup + iterations
    s_max = [max(st[k] for _, st in ranks) for k in range(n + 1)]
    t_all = [(s_max[k + 1] - s_max[k]) / 1e6 for k in range(n)]
    t = t_all[warmup:]
    it_ms = sum(t) / len(t)
    stall = [x["stall"] for rows, _ in ranks for x in rows if not x["warmup"]]
    rank_ms = [x["ms"] for rows, _ in ranks for x in rows if not x["warmup"]]
    stall_ms = sum(stall) / len(stall)
    out = {
        "_per_iteration": t_all,
        "iteration_ms": it_ms,
        "p10_ms": percentile(t, 0.10),
        "p90_ms": percentile(t, 0.90),
        "stall_ms": stall_ms,
        # What is neither emulated compute nor waiting for results: the replay's own lateness
        # (sleep overshoot, posting); near 0 when the client is not in the way.
        "client_ms": sum(rank_ms) / len(rank_ms) - compute_ms - stall_ms if compute_ms else None,
    }
    before = read_counters(os.path.join(run_dir, "before"))
    after = read_counters(os.path.join(run_dir, "after"))

    def delta(name):
        if name in before and name in after:
            return after[name] - before[name]
        return None

    ports = [delta("%s.%d.bytes" % (d, i)) for d in ("up", "down") for i in range(workers)]
    ports = [p for p in ports if p is not None]
    if ports:
        busiest = max(ports)
        out["link_mb"] = busiest / 1e6 / n
        # Steady state: one iteration's bytes over one measured iteration. (Not the whole run's
        # bytes over its span: iteration 0 waits for nothing, so its traffic spills into
        # iteration 1 and a span-based figure would exceed 100%.)
        if bps > 0 and it_ms > 0:
            out["link_util_pct"] = 100.0 * (busiest / n) * 8 / (bps * it_ms / 1e3)
        out["retrans"] = sum(delta("tcp.%d.RetransSegs" % i) or 0 for i in range(workers))
        out["rto"] = sum(delta("tcp.%d.TCPTimeouts" % i) or 0 for i in range(workers))
        out["drops"] = sum(delta("%s.%d.drops" % (d, i)) or 0
                           for d in ("up", "down") for i in range(workers))
    # TCP queues sampled during the measured iterations (replay_sample.py): mean over samples
    # of each host's Send-Q / Recv-Q, averaged over hosts.
    t0, t1 = s_max[warmup], s_max[n]
    sums, counts = {}, {}
    try:
        with open(os.path.join(run_dir, "queues")) as f:
            for line in f:
                p = line.split()
                if len(p) == 4 and t0 <= int(p[0]) <= t1:
                    h = int(p[1])
                    sq, rq = sums.get(h, (0, 0))
                    sums[h] = (sq + int(p[2]), rq + int(p[3]))
                    counts[h] = counts.get(h, 0) + 1
    except OSError:
        pass
    if counts:
        send = sum(sums[h][0] / counts[h] for h in counts) / len(counts)
        recv = sum(sums[h][1] / counts[h] for h in counts) / len(counts)
        out["sendq_kb"] = send / 1e3
        out["recvq_kb"] = recv / 1e3
        if bps > 0:
            out["sendq_ms"] = send * 8 / bps * 1e3
    # Machine-wide CPU during the run (all cores): how much was left for anything else.
    st = {k: delta("stat." + k) for k in ("user", "system", "idle", "irq", "steal")}
    if all(v is not None for v in st.values()) and sum(st.values()) > 0:
        total = sum(st.values())
        out["host_busy_pct"] = 100.0 * (total - st["idle"]) / total
        out["host_kernel_pct"] = 100.0 * (st["system"] + st["irq"]) / total
    if "loadavg_x100" in after:
        out["loadavg"] = after["loadavg_x100"] / 100.0
    span = delta("time_ns")
    cpus = [delta("cpu.%d.ticks" % i) for i in range(workers)]
    cpus = [c for c in cpus if c is not None]
    if span and cpus:
        out["daemon_cpu_pct"] = 100.0 * (sum(cpus) / len(cpus)) / clk_tck / (span / 1e9)
    waits = [delta("wait.%d.ns" % i) for i in range(workers)]
    waits = [w for w in waits if w is not None]
    if span and waits:
        out["daemon_wait_pct"] = 100.0 * (sum(waits) / len(waits)) / span
    return out


def read_sim(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[r["policy"]] = r
    return rows


def fmt(v, digits=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return "%.*f" % (digits, v)
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--work", required=True, help="run-replay's work directory")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--iterations", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--transport", required=True)
    ap.add_argument("--network", required=True)
    ap.add_argument("--clk-tck", type=int, default=100)
    ap.add_argument("--tbf-burst-ms", default="4")
    ap.add_argument("--nice", default="")
    ap.add_argument("--time-scale", default="1",
                    help="run-replay --time-scale K: compute was x K and bandwidth / K")
    ap.add_argument("--sim-overhead-us", default="", help="theta passed to gradlane-sim")
    ap.add_argument("--sim-latency-us", default="", help="latency passed to gradlane-sim")
    ap.add_argument("--mode", default="ps", help="ps or allreduce")
    ap.add_argument("--priorities", default="index")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--per-iteration", help="also write bandwidth,policy,iteration,time_ms,warmup")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    tscale = float(a.time_scale)

    runs = []
    with open(a.manifest) as f:
        for line in f:
            # The 7th field: that run's warm-up (run-replay gives gradlane more, for its trials).
            f7 = line.rstrip("\n").split("\t")
            j, label, bps, policy, run_dir, ok = f7[:6]
            warmup = int(f7[6]) if len(f7) > 6 else a.warmup
            runs.append((int(j), label, int(bps), policy, run_dir, ok == "1", warmup))

    out_rows = []
    for j, label, bps, policy, run_dir, ok, warmup in runs:
        sim = read_sim(os.path.join(a.work, "sim.%d.csv" % j))
        any_row = next(iter(sim.values()))
        shaped = bps > 0 and a.network == "netns"
        compute_ms = float(any_row["compute_ms"])
        row = {c: None for c in COLUMNS}
        row.update({
            "policy": policy, "compute_ms": compute_ms, "workers": a.workers,
            "model": any_row["model"], "transport": a.transport, "mode": a.mode,
            "priorities": a.priorities,
            "network": a.network if bps > 0 or a.network != "netns" else "netns-unshaped",
            "iterations": a.iterations, "warmup": warmup, "bandwidth": label,
            "bandwidth_gbit": bps / 1e9 if bps > 0 else None,
            "tbf_burst_ms": a.tbf_burst_ms if shaped else None, "nice": a.nice,
            "time_scale": "%g" % tscale, "sim_overhead_us": a.sim_overhead_us,
            "sim_latency_us": a.sim_latency_us,
            "bandwidth_unscaled_gbit": bps * tscale / 1e9 if bps > 0 else None,
            "sim_link_mb": float(any_row["max_link_mb"]), "status": "ok",
        })
        wire_path = os.path.join(a.work, "wire.%d" % j)
        simwire_path = os.path.join(a.work, "simwire.%d.csv" % j)
        if os.path.exists(wire_path):
            with open(wire_path) as wf:
                row["wire_gbit"] = float(wf.read().strip()) / 1e9
        if os.path.exists(simwire_path):
            sw = read_sim(simwire_path)
            row["ideal_at_wire_ms"] = float(sw["ideal"]["iteration_ms"])
            if policy in sw:
                row["sim_at_wire_ms"] = float(sw[policy]["iteration_ms"])
        if bps > 0:
            row["rho"] = float(any_row["rho"])
            row["ideal_ms"] = float(sim["ideal"]["iteration_ms"])
            if policy in sim:
                row["sim_iteration_ms"] = float(sim[policy]["iteration_ms"])
        if ok:
            try:
                row.update(measure(run_dir, a.workers, a.iterations, warmup,
                                   bps if shaped else 0, a.clk_tck, compute_ms))
            except (ValueError, OSError, KeyError) as e:
                row["status"] = "failed: %s" % e
        else:
            row["status"] = "failed (see the messages above)"
        if a.transport != "tcp":
            # Not on TCP: no sockets to sample, no TCP counters (blank, not 0).
            for c in ("sendq_kb", "sendq_ms", "recvq_kb", "retrans", "rto"):
                row[c] = None
        if row["iteration_ms"] is not None:
            if row["ideal_ms"]:
                row["ratio_to_ideal"] = row["iteration_ms"] / row["ideal_ms"]
            if row["sim_iteration_ms"]:
                row["vs_sim"] = row["iteration_ms"] / row["sim_iteration_ms"]
        for c in UNSCALED:
            if row[c] is not None:
                row[c + "_unscaled"] = row[c] / tscale
        row["_j"] = j
        out_rows.append(row)

    # Speed-up over fifo measured at the same bandwidth (empty when fifo was not run).
    for row in out_rows:
        fifo = [r for r in out_rows if r["_j"] == row["_j"] and r["policy"] == "fifo"]
        if fifo and fifo[0]["iteration_ms"] and row["iteration_ms"]:
            row["speedup_vs_fifo"] = fifo[0]["iteration_ms"] / row["iteration_ms"]

    digits = {"sendq_kb": 0, "recvq_kb": 0, "sendq_ms": 1, "wire_gbit": 2, "host_busy_pct": 1,
              "host_kernel_pct": 1, "loadavg": 2, "retrans": 0, "rto": 0, "drops": 0,
              "workers": 0, "iterations": 0, "warmup": 0, "link_util_pct": 1,
              "daemon_cpu_pct": 1, "daemon_wait_pct": 1, "rho": 3, "bandwidth_unscaled_gbit": 3}
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for row in out_rows:
            w.writerow([fmt(row[c], digits.get(c, 3)) if not isinstance(row[c], int)
                        else str(row[c]) for c in COLUMNS])

    if a.per_iteration:
        with open(a.per_iteration, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["bandwidth", "policy", "iteration", "time_ms", "warmup"])
            for row in out_rows:
                for k, ms in enumerate(row.get("_per_iteration") or []):
                    w.writerow([row["bandwidth"], row["policy"], k, "%.3f" % ms,
                                1 if k < row["warmup"] else 0])

    if not a.quiet:
        table_cols = [("policy", "policy", None), ("iteration_ms", "iter_ms", 1),
                      ("speedup_vs_fifo", "vs_fifo", 3), ("ratio_to_ideal", "/ideal", 3),
                      ("sim_iteration_ms", "sim_ms", 1), ("vs_sim", "/sim", 3),
                      ] + ([("iteration_ms_unscaled", "iter/K", 1)] if tscale != 1 else []) + [
                      ("sim_at_wire_ms", "sim@wire", 1),
                      ("p10_ms", "p10", 1), ("p90_ms", "p90", 1), ("stall_ms", "stall", 1),
                      ("client_ms", "client", 1), ("link_mb", "link_MB", 1),
                      ("link_util_pct", "util%", 1), ("sendq_ms", "sendq_ms", 1),
                      ("recvq_kb", "recvq_kB", 0), ("retrans", "retrans", 0), ("rto", "rto", 0),
                      ("drops", "drops", 0), ("daemon_cpu_pct", "cpu%", 1),
                      ("daemon_wait_pct", "wait%", 1),
                      ("host_busy_pct", "host%", 1), ("host_kernel_pct", "kern%", 1),
                      ("loadavg", "load", 1)]
        for j in sorted({r["_j"] for r in out_rows}):
            rows = [r for r in out_rows if r["_j"] == j]
            r0 = rows[0]
            bw = ("%g Gbit/s tbf each way" % r0["bandwidth_gbit"]) if r0["bandwidth_gbit"] and \
                a.network == "netns" else ("unshaped (%s)" % a.network)
            print("\n%s, W=%d, %s, %s transport, %d+%d iterations; compute %.1f ms%s" % (
                r0["model"], a.workers, bw, a.transport, a.warmup, a.iterations, r0["compute_ms"],
                (", rho %.3f, simulated busiest link %.1f MB/iteration" % (r0["rho"], r0["sim_link_mb"]))
                if r0["rho"] else ""))
            if tscale != 1:
                print("time scale %s: compute x %s and bandwidth / %s (the run stands for %s, compute"
                      " %.1f ms); times as measured, iter/K divided by %s; theta %s us and latency %s us"
                      " not scaled" % (a.time_scale, a.time_scale, a.time_scale,
                                       ("%g Gbit/s" % r0["bandwidth_unscaled_gbit"])
                                       if r0["bandwidth_unscaled_gbit"] else "unshaped",
                                       r0["compute_ms_unscaled"], a.time_scale,
                                       a.sim_overhead_us or "?", a.sim_latency_us or "?"))
            cells = [[h for _, h, _ in table_cols]]
            for r in rows:
                cells.append([r[c] if d is None else fmt(r[c], d) for c, _, d in table_cols])
            if r0["ideal_ms"]:
                cells.append([{"policy": "ideal (sim)", "iteration_ms": fmt(r0["ideal_ms"], 1),
                               "iteration_ms_unscaled": fmt(r0["ideal_ms_unscaled"], 1)}.get(c, "")
                              for c, _, _ in table_cols])
            widths = [max(len(str(c[i])) for c in cells) for i in range(len(table_cols))]
            for c in cells:
                print("  ".join(str(x).ljust(widths[0]) if i == 0 else str(x).rjust(widths[i])
                                for i, x in enumerate(c)))
            done = [r for r in rows if r["iteration_ms"]]
            for r in rows:
                if r["status"] != "ok":
                    print("  %s: %s" % (r["policy"], r["status"]))
            if done and r0["ideal_ms"]:
                best = min(done, key=lambda r: r["iteration_ms"])
                print("  best: %s, %.3fx the ideal bound (target <= 1.10x)%s" % (
                    best["policy"], best["ratio_to_ideal"],
                    "" if best["ratio_to_ideal"] <= 1.10 else " -- NOT within 1.10x"))
        print("\n(iter_ms: mean of T(k) = max over ranks of the next forward start - max of this"
              " one; stall: forward waiting for results; client: rank time - compute - stall;"
              " link_MB: busiest port's bytes per iteration, headers included; util%: of the"
              " tbf rate; sendq_ms: a host's unacknowledged TCP bytes (mean) at the rate; recvq_kB: bytes"
              " arrived but not yet read by the daemon (mean per host); rto: TCP retransmission timeouts; cpu%: per daemon, of one core;"
              " wait%: per daemon, time its threads were runnable but waiting for a CPU;"
              " host%/kern%: the machine's CPU busy / in the kernel, all cores; load: 1-min"
              " load average at the end" +
              ("; iter/K: iter_ms divided by the time scale; every other time as measured"
               if tscale != 1 else "") + ")")
    # 3: the report is written but some run has no figures (run-replay then exits 1).
    return 0 if all(r["status"] == "ok" for r in out_rows) else 3


if __name__ == "__main__":
    sys.exit(main())
