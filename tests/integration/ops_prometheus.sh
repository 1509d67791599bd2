#!/usr/bin/env bash
# ops_prometheus: a real Prometheus server (Debian's `prometheus`) scrapes three gradlaned while a
# job of three gradlane-check ranks runs, with deploy/gradlane-alerts.yml loaded. Checks:
#   1. while the job runs, every metric named in deploy/grafana-dashboard.json's queries and in
#      the alert rules exists on a live daemon's /metrics;
#   2. through Prometheus's HTTP API after the job: the scheduled bytes all daemons sent (and
#      received), push and pull, equal what the test pushed: iterations x (W-1) x bytes per
#      iteration each way (every partition is pushed by the W-1 ranks that do not own it and
#      pulled back by them);
#   3. each rank's iteration time was recorded: iterations-1 samples, a positive sum;
#   4. all three targets up and the alert rules loaded.
#   ops_prometheus.sh GRADLANED GRADLANE-CHECK DASHBOARD.json ALERTS.yml
# Skips (77) without the prometheus binary (deploy/install-deps.sh installs it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$1" "$2"
dashboard=$3 alerts=$4
PROM=$(command -v prometheus || true)
if [[ -z $PROM ]]; then
  echo "SKIP: needs the prometheus server binary (Debian package prometheus; deploy/install-deps.sh)" >&2
  exit 77
fi
command -v curl >/dev/null || it_fail "curl missing"
iters=${IT_ITERATIONS:-25}
W=3

gl_env_init "$W"
declare -a MADDR=()
for i in 0 1 2; do
  gl_daemon_start "$i" --metrics_address="${GL_IP[i]}:0" --link_capacity=10gbit
  line=$(grep -m1 'gradlaned: ops metrics=' "$GL_TMP/daemon$i.err")
  [[ $line =~ metrics=([^ ]+) ]] || it_fail "daemon $i: no metrics endpoint in '$line'"
  MADDR[i]=${BASH_REMATCH[1]}
done
echo "metrics endpoints: ${MADDR[*]}"

# Prometheus in host 0's namespace (it reaches every host), on a free local port.
prom_port=$(gl_exec 0 python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$GL_TMP/prom/data"
cp "$alerts" "$GL_TMP/prom/alerts.yml"
{
  echo "global: {scrape_interval: 1s, evaluation_interval: 1s}"
  echo "rule_files: [alerts.yml]"
  echo "scrape_configs:"
  echo "  - job_name: gradlane"
  echo "    scrape_interval: 1s"
  echo "    scrape_timeout: 900ms"
  echo "    static_configs:"
  echo "      - targets: [$(IFS=,; echo "${MADDR[*]}" | sed 's/,/, /g')]"
} >"$GL_TMP/prom/prometheus.yml"
promtool check config "$GL_TMP/prom/prometheus.yml" >/dev/null || it_fail "generated prometheus.yml invalid"
gl_bg 0 prometheus "$PROM" --config.file="$GL_TMP/prom/prometheus.yml" \
  --storage.tsdb.path="$GL_TMP/prom/data" --web.listen-address="127.0.0.1:$prom_port" \
  --log.level=warn
api="http://127.0.0.1:$prom_port"
for ((k = 0; k < 150; k++)); do
  gl_exec 0 curl -sf "$api/-/ready" >/dev/null 2>&1 && break
  kill -0 "${GL_PID[prometheus]}" 2>/dev/null || { gl_show prometheus; it_fail "prometheus exited"; }
  sleep 0.2
done
gl_exec 0 curl -sf "$api/-/ready" >/dev/null || { gl_show prometheus; it_fail "prometheus not ready"; }
echo "prometheus $("$PROM" --version 2>&1 | head -1 | awk '{print $3}') on port $prom_port"

# query EXPR -> the first sample's value ("" when the result is empty)
query() {
  gl_exec 0 curl -sf --get "$api/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys
d=json.load(sys.stdin)
r=d["data"]["result"]
print(r[0]["value"][1] if r else "")'
}

# --- 1. the job; while it runs, the dashboard's and alerts' metrics exist on a live daemon.
# The clients keep their sessions 8 s after the last iteration (--linger_ms) so the job's live
# series (peer state, estimates) are still there when the check runs on a fast machine.
sizes=1000,50001,300001,1048576
it_job_start prom bytescheduler "$iters" 11 -- --quiet --dtypes=f32 --sizes="$sizes" --linger_ms=8000
names=$(python3 - "$dashboard" "$alerts" <<'EOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
          for v in d.get("templating", {}).get("list", [])]
exprs.append(open(sys.argv[2]).read())
print(" ".join(sorted({m for e in exprs for m in re.findall(r"\bgradlane_[a-z0-9_]+", e)})))
EOF
)
[[ -n $names ]] || it_fail "no gradlane_ metric in the dashboard"
missing=""
deadline=$((SECONDS + 60))
while :; do
  gl_exec 0 curl -sf "http://${MADDR[0]}/metrics" >"$GL_TMP/metrics0.txt" || true
  missing=""
  for n in $names; do grep -Eq "^$n(\{| )" "$GL_TMP/metrics0.txt" || missing+=" $n"; done
  [[ -z $missing ]] && break
  ((SECONDS < deadline)) || break
  sleep 0.5
done
[[ -z $missing ]] || it_fail "metrics named in the dashboard/alerts missing on a live daemon:$missing"
echo "all $(wc -w <<<"$names") metrics named in the dashboard and alert rules exist on a live daemon"

it_job_wait prom 180 || it_fail "the job failed (above)"
B=$(sed -nE 's/.*bytes\/iteration=([0-9]+).*/\1/p' "$GL_TMP/prom.r0.out")
[[ -n $B ]] || it_fail "no bytes/iteration in the client's summary"
want=$((iters * (W - 1) * B))
echo "pushed: $iters iterations x $B bytes per rank; expect $want bytes each way in total"

# --- 2. bytes through Prometheus: poll until the last scrapes are in (values only grow).
check_sum() {
  local expr=$1 got="" k
  for ((k = 0; k < 60; k++)); do
    got=$(query "$expr")
    [[ -n $got && $(printf '%.0f' "$got") == "$want" ]] && { echo "  $expr = $got"; return 0; }
    sleep 0.5
  done
  it_fail "$expr = '${got}', want $want"
}
check_sum 'sum(gradlane_sent_bytes_total{direction="push"})'
check_sum 'sum(gradlane_sent_bytes_total{direction="pull"})'
check_sum 'sum(gradlane_received_bytes_total{direction="push"})'
check_sum 'sum(gradlane_received_bytes_total{direction="pull"})'

# --- 3. iteration time of every rank.
for i in 0 1 2; do
  n=$(query "gradlane_job_iteration_seconds_count{job_id=\"prom\",instance=\"${MADDR[i]}\"}")
  s=$(query "gradlane_job_iteration_seconds_sum{job_id=\"prom\",instance=\"${MADDR[i]}\"}")
  [[ $n == $((iters - 1)) ]] || it_fail "rank $i: $n iteration-time samples, want $((iters - 1))"
  awk -v s="$s" 'BEGIN{exit !(s > 0)}' || it_fail "rank $i: iteration time sum '$s'"
  echo "  rank $i: $n iterations timed, $(awk -v s="$s" -v n="$n" 'BEGIN{printf "%.1f ms", 1000*s/n}') mean"
done

# --- 4. targets and rules.
up=$(query 'sum(up{job="gradlane"})')
[[ $up == 3 ]] || it_fail "up targets: '$up', want 3"
rules=$(gl_exec 0 curl -sf "$api/api/v1/rules" | python3 -c 'import json,sys
d=json.load(sys.stdin); print(sum(len(g["rules"]) for g in d["data"]["groups"]))')
want_rules=$(grep -c '^ *- alert:' "$alerts")
[[ $rules == "$want_rules" ]] || it_fail "prometheus loaded $rules alert rules, want $want_rules"
echo "3 targets up, $rules alert rules loaded"

for i in 0 1 2; do
  gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"
done
echo "PASS ops_prometheus ($GL_MODE)"
