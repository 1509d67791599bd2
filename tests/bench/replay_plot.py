#!/usr/bin/env python3
"""tests/bench/replay_plot.py — the replay benchmark's figure (tests/bench/replay-default-set.sh).

    replay_plot.py COMBINED.csv OUT.png [--title TEXT]

One panel per model (and transport); per bandwidth a group of bars, one per policy: the measured iteration time
over the ideal bound (run-replay's ratio_to_ideal), with the simulator's prediction for the same
policy as a black tick on the bar (dotted: the simulator at the rate iperf3 measured between
the same namespaces, where calibrated), and the 1.10x target as a dashed line. Rows without a
simulator (unshaped runs) are left out. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import csv
import sys
import textwrap

POLICY_ORDER = ["fifo", "p3", "bytescheduler", "prophet"]
COLORS = {"fifo": "#8c8c8c", "p3": "#e6a23c", "bytescheduler": "#4c72b0", "prophet": "#55a868"}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("replay_plot: matplotlib is not installed (Debian: python3-matplotlib, "
              "deploy/install-deps.sh)", file=sys.stderr)
        return 2

    rows = []
    with open(a.csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["ratio_to_ideal"] and r["bandwidth_gbit"]:
                rows.append(r)
    if not rows:
        print("replay_plot: no shaped rows with figures in %s" % a.csv, file=sys.stderr)
        return 1
    # One panel per model and transport.
    for r in rows:
        r["panel"] = r["model"] + ("" if r.get("transport", "tcp") == "tcp" else
                                   " over " + r["transport"].upper())
    models = []
    for r in rows:
        if r["panel"] not in models:
            models.append(r["panel"])
    policies = [p for p in POLICY_ORDER if any(r["policy"] == p for r in rows)]
    policies += sorted({r["policy"] for r in rows} - set(policies))

    fig, axes = plt.subplots(1, len(models), figsize=(max(7.5, 5.2 * len(models)), 5.0),
                             squeeze=False)
    def rel(r, col):
        return float(r[col]) / float(r["ideal_ms"]) if r.get(col) else 0.0
    width = 0.8 / len(policies)
    for ax, model in zip(axes[0], models):
        mrows = [r for r in rows if r["panel"] == model]
        ymax = max(max(float(r["ratio_to_ideal"]), rel(r, "sim_iteration_ms"),
                       rel(r, "sim_at_wire_ms")) for r in mrows)
        bws = sorted({float(r["bandwidth_gbit"]) for r in mrows})
        for pi, p in enumerate(policies):
            for bi, bw in enumerate(bws):
                match = [r for r in mrows if r["policy"] == p and float(r["bandwidth_gbit"]) == bw]
                if not match:
                    continue
                r = match[0]
                x = bi + (pi - (len(policies) - 1) / 2) * width
                ratio = float(r["ratio_to_ideal"])
                ax.bar(x, ratio, width * 0.92, color=COLORS.get(p, None),
                       label=p if bi == 0 else None, zorder=2)
                ax.text(x, ratio + 0.01 * ymax, "%.0f" % float(r["iteration_ms"]),
                        ha="center", va="bottom", fontsize=6.5, rotation=90, zorder=3)
                if r["sim_iteration_ms"]:
                    sim = float(r["sim_iteration_ms"]) / float(r["ideal_ms"])
                    ax.plot([x - width * 0.46, x + width * 0.46], [sim, sim], color="black",
                            linewidth=2, zorder=4,
                            label="simulator" if bi == 0 and pi == 0 else None)
                if r.get("sim_at_wire_ms"):
                    sw = float(r["sim_at_wire_ms"]) / float(r["ideal_ms"])
                    ax.plot([x - width * 0.46, x + width * 0.46], [sw, sw], color="black",
                            linewidth=1.2, linestyle=":", zorder=4,
                            label="simulator at iperf3's rate" if bi == 0 and pi == 0 else None)
        ax.axhline(1.0, color="black", linewidth=0.8, zorder=1)
        ax.axhline(1.10, color="#c44e52", linewidth=1, linestyle="--", zorder=1,
                   label="1.10x target")
        ax.set_xticks(range(len(bws)))
        labels = []
        for bw in bws:
            r = next(r for r in mrows if float(r["bandwidth_gbit"]) == bw)
            labels.append("%g Gbit/s\nideal %.0f ms, rho %.2f" % (bw, float(r["ideal_ms"]),
                                                                  float(r["rho"])))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title("%s, W=%s" % (model, mrows[0]["workers"]), fontsize=10)
        ax.grid(axis="y", linewidth=0.4, alpha=0.6, zorder=0)
        ax.set_ylim(0.8, max(ymax * 1.12, 1.25))
    axes[0][0].set_ylabel("iteration time / ideal bound (lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.995))
    note = a.title or ("bars: measured through gradlaned, iteration time over gradlane-sim's "
                       "ideal bound (numbers: ms); solid ticks: the simulator's prediction for "
                       "the policy; dotted: the simulator at the rate iperf3 got between the "
                       "same namespaces just before")
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(note, int(fig.get_figwidth() * 15))), ha="center", va="bottom",
             fontsize=7.5)
    fig.tight_layout(rect=(0, 0.05, 1, 0.90))
    fig.savefig(a.png, dpi=130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
