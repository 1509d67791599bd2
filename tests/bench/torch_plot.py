"""torch_plot.py — the training benchmark's CSV (torch_bench.sh) as a PNG: per link rate, the
median iteration time of the compute floor, DDP + gloo and gradlane.torch under each policy,
with the p90 as the top of each whisker.

    python3 tests/bench/torch_plot.py IN.csv OUT.png"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    runs = list(dict.fromkeys((r["mode"], r["policy"]) for r in rows))
    label = {run: (run[0] if not run[1] else f"gradlane.torch {run[1]}") for run in runs}
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, run in enumerate(runs):
        xs, med, err = [], [], []
        for j, rate in enumerate(rates):
            r = [x for x in rows if x["rate"] == rate and (x["mode"], x["policy"]) == run]
            if not r:
                continue
            xs.append(j + (i - (len(runs) - 1) / 2) * width)
            m, p90 = float(r[0]["median_ms"]), float(r[0]["p90_ms"])
            med.append(m)
            err.append(max(p90 - m, 0.0))
        ax.bar(xs, med, width, yerr=[[0] * len(err), err], capsize=2, label=label[run])
    ax.set_xticks(range(len(rates)))
    ax.set_xticklabels([f"{r} per link" for r in rates])
    ax.set_ylabel("iteration time, ms (median; whisker: p90)")
    ax.set_title("ResNet-18 32x32, W = 3, batch 16 per rank (tests/bench/torch_bench.sh)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
