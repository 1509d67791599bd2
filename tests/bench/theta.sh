#!/usr/bin/env bash
# tests/bench/theta.sh — the per-message cost θ of the real daemons (issue #12), per transport.
#
# θ is the simulator's per-message cost: the time a message holds its sender's link besides its
# bytes (gradlane-sim --overhead_us, SimConfig::overhead_ns; PolicyConfig::per_message_overhead_ns
# in the daemon). Here it is measured as what one more message per host costs in iteration time
# when the same bytes are reduced in more, smaller messages.
#
# What runs: two hosts in network namespaces (tests/integration/netns.sh: veth through a bridge,
# MTU 9000, unshaped unless THETA_RATE is set), a gradlaned per host and gradlane-replay ranks
# reducing one f32 tensor of S bytes with zero compute (tests/bench/goodput_lib.sh), policy
# bytescheduler with --partition_bytes=δ (every partition is one message: one segment per
# dispatch) and a credit window of THETA_CREDIT bytes for every δ, so that the window is the
# same and the only thing that changes with δ is the message count. For each δ the daemons are
# started once and run two jobs, one per total size S (THETA_BYTES), so bytes and messages vary
# independently.
#
# Per host and iteration, with W = 2: every partition is either owned by the other host (this
# host pushes it) or by this one (this host sends the other rank its result), so each host's
# uplink carries exactly S bytes in n = ceil(S/δ) messages — the simulator's "messages on one
# sender's link". (Checked against the daemons' segments_sent at exit.) The fit, by least
# squares over every (δ, S) point of a transport:
#     T = a + S/R + n·θ
# T: the median iteration (= one reduction) over both ranks' measured iterations; a: a fixed
# cost per iteration (the last partition's round trip, the client's post and completion);
# R: the byte rate the daemons sustain (CPU-bound when unshaped); θ: per message per host.
# The same fit of the daemons' CPU time per reduction (utime + stime, mean of the two daemons)
# gives the CPU per message (over DPDK a polling daemon is busy all the time, so there it is
# the wall time again). Also printed: the cost per extra message between neighbouring sizes,
# which would all be θ if the cost per message did not depend on the size.
#
#   tests/bench/theta.sh [BUILD_DIR]          default build dir: build
#   env: THETA_TRANSPORTS ("tcp dpdk"; dpdk is skipped with a message if the build lacks it),
#        THETA_SIZES ("16384 65536 262144 1048576 4194304": δ, message bytes),
#        THETA_BYTES ("67108864 201326592": S per job), THETA_ITERATIONS (8), THETA_WARMUP (2),
#        THETA_ROUNDS (3: every δ is measured this many times, in alternating order),
#        THETA_CREDIT (16777216), THETA_RATE ("": unshaped; e.g. 5gbit shapes both ways with tbf),
#        THETA_POLICY (bytescheduler), THETA_NICE (-10 as goodput.sh; "keep" leaves it),
#        THETA_CSV (file: one row per point)
# Needs root (network namespaces) and python3; exits 77 with a message without them (and when
# no transport asked for could run). About 2 minutes with the defaults on the 2-core
# development VM. Results: docs/benchmarks.md,
# "Per-message cost θ".
set -euo pipefail
nice=${THETA_NICE:--10}
if [[ $nice != keep ]] && ! renice -n "$nice" -p $$ >/dev/null 2>&1; then
  echo "theta: note: cannot set niceness $nice; running at $(ps -o ni= -p $$ | tr -d ' ')" >&2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
transports=(${THETA_TRANSPORTS:-tcp dpdk})
sizes=(${THETA_SIZES:-16384 65536 262144 1048576 4194304})
totals=(${THETA_BYTES:-67108864 201326592})
iters=${THETA_ITERATIONS:-8}
warmup=${THETA_WARMUP:-2}
rounds=${THETA_ROUNDS:-3}
credit=${THETA_CREDIT:-16777216}
rate=${THETA_RATE:-}
policy=${THETA_POLICY:-bytescheduler}
csv_out=${THETA_CSV:-}

for v in "${sizes[@]}" "${totals[@]}" "$iters" "$warmup" "$rounds" "$credit"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "theta: error: '$v' is not a positive integer" >&2; exit 2; }
done
for t in "${transports[@]}"; do
  [[ $t == tcp || $t == dpdk ]] || { echo "theta: error: transport '$t' (tcp or dpdk)" >&2; exit 2; }
done
if ((${#sizes[@]} < 2 || (${#totals[@]} < 2 && ${#sizes[@]} < 3))); then
  echo "theta: error: the fit needs two sizes (THETA_SIZES) and two totals (THETA_BYTES), or three sizes" >&2
  exit 2
fi

source "$root/tests/integration/netns.sh"
source "$root/tests/bench/goodput_lib.sh"
goodput_binaries "$bdir"
command -v python3 >/dev/null || { echo "SKIP: python3 needed for the fit" >&2; exit 77; }
# A build without DPDK has no dpdk_raw (tests/bench/meson.build builds it with the DPDK library).
has_dpdk=0
[[ -x $bdir/tests/bench/dpdk_raw ]] && has_dpdk=1

gl_env_init --need-netns 2   # exits 77 without namespaces (not root / no CAP_NET_ADMIN)
[[ -n $rate ]] && { gl_shape "$rate" || exit 2; }
max_total=0
for s in "${totals[@]}"; do ((s > max_total)) && max_total=$s; done

points="$GL_TMP/points.csv"
echo "transport,round,msg_bytes,bytes_per_host,msgs_per_host,iteration_ms,mean_ms,daemon_cpu_ms,segments_sent_check,load1" >"$points"
ticks=$(getconf CLK_TCK)
# utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15; the command name
# in parentheses holds no spaces here).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# One δ on one transport: fresh daemons, one job per total; appends to $points.
measure() {
  local transport=$1 round=$2 size=$3 r s n ms mean cpu c0 c1 expect=0 sent load tag
  GL_TRANSPORT=$transport
  for r in 0 1; do
    if ! gl_daemon_start "$r" --peer_timeout=10s --max_arena_bytes=$((max_total + (64 << 20))) \
        --default_policy="$policy" --partition_bytes="$size" --credit_bytes="$credit"; then
      GL_TRANSPORT=tcp
      return 1
    fi
  done
  local -a rows=()
  for s in "${totals[@]}"; do
    bytes=$s
    goodput_profile tests/bench/theta.sh
    tag="$transport-$size-$s-$round"
    c0=$(($(cpu_ticks "${GL_DPID[0]}") + $(cpu_ticks "${GL_DPID[1]}")))
    read -r _ mean <<<"$(goodput_reduce "$tag")" || { GL_TRANSPORT=tcp; return 1; }
    [[ -n $mean ]] || { GL_TRANSPORT=tcp; return 1; }
    c1=$(($(cpu_ticks "${GL_DPID[0]}") + $(cpu_ticks "${GL_DPID[1]}")))
    # The median of both ranks' measured iterations: one iteration that lost its CPU to
    # something else on the machine moves a mean of a few iterations, not the median.
    ms=$(cat "$GL_TMP/$tag.r0.csv" "$GL_TMP/$tag.r1.csv" |
      awk -F, '$1 != "iteration" && $4 == 0 { print $2 }' | sort -g |
      awk '{ v[NR] = $1 } END { if (NR) printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    # CPU per daemon per reduction over the whole job (warm-up and job set-up included).
    cpu=$(awk -v d=$((c1 - c0)) -v t="$ticks" -v k=$((iters + warmup)) \
      'BEGIN { printf "%.3f", d * 1000 / t / 2 / k }')
    n=$(((s + size - 1) / size))
    expect=$((expect + (iters + warmup) * n))
    rows+=("$s $n $ms $mean $cpu")
  done
  load=$(cut -d' ' -f1 /proc/loadavg)
  sent=""
  for r in 0 1; do
    gl_daemon_stop "$r" || true
    sent+=" $(sed -n 's/.*engine stats: .* segments_sent=\([0-9]*\).*/\1/p' "$GL_TMP/daemon$r.err" | tail -1)"
  done
  # The check: each daemon sent exactly the messages the plan says (push or pull response, one
  # per partition per reduction); a mismatch means n below is not what went on the wire.
  local check=ok
  for r in $sent; do [[ $r == "$expect" ]] || check="mismatch(expected $expect, got$sent)"; done
  for row in "${rows[@]}"; do
    read -r s n ms mean cpu <<<"$row"
    echo "$transport,$round,$size,$s,$n,$ms,$mean,$cpu,$check,$load" >>"$points"
  done
  GL_TRANSPORT=tcp
}

fit() {  # fit TRANSPORT LOAD_BEFORE
  python3 - "$points" "$1" "$2" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import csv, math, statistics, sys
path, transport, load0, load1 = sys.argv[1:5]
rows = [r for r in csv.DictReader(open(path)) if r["transport"] == transport]
if not rows:
    sys.exit(0)

def lstsq(X, y):
    """Least squares by the normal equations (columns scaled first: bytes are ~1e8, messages
    ~1e4). Returns (coefficients, standard errors, fitted values)."""
    k = len(X[0])
    scale = [max(abs(x[j]) for x in X) or 1.0 for j in range(k)]
    Xs = [[x[j] / scale[j] for j in range(k)] for x in X]
    A = [[sum(r[p] * r[q] for r in Xs) for q in range(k)] + [float(p == q) for q in range(k)]
         for p in range(k)]
    for c in range(k):  # Gauss-Jordan with partial pivoting: A becomes [I | (X'X)^-1]
        piv = max(range(c, k), key=lambda r: abs(A[r][c]))
        if abs(A[piv][c]) < 1e-9:
            return None
        A[c], A[piv] = A[piv], A[c]
        A[c] = [v / A[c][c] for v in A[c]]
        for r in range(k):
            if r != c:
                A[r] = [a - A[r][c] * b for a, b in zip(A[r], A[c])]
    inv = [row[k:] for row in A]
    xty = [sum(Xs[i][p] * y[i] for i in range(len(y))) for p in range(k)]
    b = [sum(inv[p][q] * xty[q] for q in range(k)) for p in range(k)]
    fitted = [sum(b[j] * Xs[i][j] for j in range(k)) for i in range(len(y))]
    s2 = sum((yi - fi) ** 2 for yi, fi in zip(y, fitted)) / max(len(y) - k, 1)
    se = [math.sqrt(max(s2 * inv[j][j], 0.0)) / scale[j] for j in range(k)]
    return [b[j] / scale[j] for j in range(k)], se, fitted

# T = a + S/R + n θ; with one total S the intercept and S/R are one constant.
two_totals = len({r["bytes_per_host"] for r in rows}) > 1
def design(r):
    x = [1.0, float(r["msgs_per_host"])]
    return x + [float(r["bytes_per_host"])] if two_totals else x

X = [design(r) for r in rows]
fits = {}
for col in ("iteration_ms", "daemon_cpu_ms"):
    y = [float(r[col]) for r in rows]
    out = lstsq(X, y)
    if out is None:
        print(f"{transport}: the points do not determine the fit (vary THETA_SIZES)")
        sys.exit(1)
    fits[col] = (y,) + out

print(f"{'msg_bytes':>10} {'S_bytes':>10} {'msgs/host':>9} {'iter_ms':>8} {'fit_ms':>8} {'resid':>7}"
      f" {'cpu_ms':>7} {'round':>5} {'load':>5}  segments")
y, coef, se, fitted = fits["iteration_ms"]
for r, f in zip(rows, fitted):
    t = float(r["iteration_ms"])
    print(f"{r['msg_bytes']:>10} {r['bytes_per_host']:>10} {r['msgs_per_host']:>9} {t:8.1f} {f:8.1f}"
          f" {t - f:+7.1f} {float(r['daemon_cpu_ms']):7.1f} {r['round']:>5} {r['load1']:>5}"
          f"  {r['segments_sent_check']}")

# The local slope between neighbouring message sizes (medians over rounds, per S): what one
# more message costs there. A θ that does not depend on the message size gives equal slopes.
print("local cost per extra message (median over rounds), between neighbouring sizes:")
for S in sorted({r["bytes_per_host"] for r in rows}, key=int):
    by = {}
    for r in rows:
        if r["bytes_per_host"] == S:
            by.setdefault(int(r["msg_bytes"]), []).append(r)
    sizes = sorted(by, reverse=True)
    parts = []
    for big, small in zip(sizes, sizes[1:]):
        nb, ns = int(by[big][0]["msgs_per_host"]), int(by[small][0]["msgs_per_host"])
        tb = statistics.median(float(r["iteration_ms"]) for r in by[big])
        ts = statistics.median(float(r["iteration_ms"]) for r in by[small])
        parts.append(f"{big // 1024}K->{small // 1024}K {(ts - tb) / (ns - nb) * 1e3:+.1f} us")
    print(f"  S={int(S) >> 20} MiB: " + ", ".join(parts))

def line(label, col, unit):
    y, coef, se, fitted = fits[col]
    rms = math.sqrt(sum((a - b) ** 2 for a, b in zip(y, fitted)) / len(y))
    mean = sum(y) / len(y)
    rate = ""
    if two_totals and coef[2] > 0:
        rate = f"; R = {8 / (coef[2] * 1e-3) / 1e9:.2f} Gbit/s{unit}"
    print(f"{transport}: {label} = {coef[1] * 1e3:.1f} us per message per host (+- {se[1] * 1e3:.1f},"
          f" 1 s.e.){rate}; a = {coef[0]:.1f} ms; residual rms {rms:.1f} ms"
          f" ({100 * rms / mean:.1f}% of the mean {mean:.1f} ms), {len(y)} points")

line("theta", "iteration_ms", "")
line("daemon CPU per message", "daemon_cpu_ms", " of CPU")
print(f"{transport}: load average {load0} before, {load1} after")
PY
}

echo "theta: W=2, $GL_MODE, mtu $GL_MTU, ${rate:-unshaped}, $policy, credit $credit B, message sizes ${sizes[*]} B," \
  "S = ${totals[*]} B, $warmup+$iters iterations, $rounds rounds, nice $(ps -o ni= -p $$ | tr -d ' ')"
rc=0 measured=0
for transport in "${transports[@]}"; do
  if [[ $transport == dpdk ]] && ((!has_dpdk)); then
    echo "theta: SKIP dpdk: $bdir was built without DPDK (no tests/bench/dpdk_raw; install libdpdk-dev and reconfigure)"
    continue
  fi
  measured=1
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  echo
  echo "== $transport (load average $load_before)"
  ok=1
  for ((round = 0; round < rounds; round++)); do
    order=("${sizes[@]}")
    if ((round % 2)); then  # alternate the order, so a drift in the machine does not look like θ
      order=()
      for ((j = ${#sizes[@]} - 1; j >= 0; j--)); do order+=("${sizes[j]}"); done
    fi
    for size in "${order[@]}"; do
      if ! measure "$transport" "$round" "$size"; then
        echo "theta: $transport: the run with $size-byte messages failed" >&2
        for r in 0 1; do gl_show "daemon$r" 10; gl_daemon_stop "$r" || true; done
        ok=0 rc=1
        break 2
      fi
    done
  done
  ((ok)) && { fit "$transport" "$load_before" || rc=1; }
done
if [[ -n $csv_out ]]; then cp "$points" "$csv_out"; fi
((measured)) || exit 77
exit "$rc"
