#!/usr/bin/env bash
# deploy_check: the shipped operations files are valid for the tools that read them.
#   - deploy/prometheus.yml with its rule file: `promtool check config`;
#   - deploy/gradlane-alerts.yml: `promtool check rules`, and each of the required alerts
#     (link saturated, peer down, errors rising) is there;
#   - the systemd unit meson generated for this prefix: `systemd-analyze verify` (ExecStart
#     pointed at the gradlaned just built, so the check does not depend on an install), and
#     it is Type=notify with a watchdog, a restart policy, the hardening and RuntimeDirectory;
#   - deploy/gradlaned.conf: every flag in it is one gradlaned accepts (gradlaned parses it and
#     exits 1 on an unknown flag) — run with --helpfull would not prove that, so the flagfile is
#     loaded with a test socket and port and the daemon must come up.
#   - deploy/grafana-dashboard.json: valid JSON with panels and queries;
#   - gradlaned talks to systemd's notification socket: READY=1, WATCHDOG=1 pings, STOPPING=1.
# A missing tool skips only its part, with a message; the whole test skips (77) if no part ran.
#   deploy_check.sh GRADLANED UNIT PROMETHEUS.yml ALERTS.yml DASHBOARD.json GRADLANED.conf
set -uo pipefail
daemon=$1 unit=$2 prom=$3 alerts=$4 dash=$5 conf=$6
ran=0 failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
tmp=$(mktemp -d /tmp/gl-deploy.XXXXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
pid=""

if command -v promtool >/dev/null; then
  ran=1
  # promtool resolves rule_files relative to the config: check a copy next to the rules.
  cp "$prom" "$tmp/prometheus.yml"
  cp "$alerts" "$tmp/gradlane-alerts.yml"
  promtool check config "$tmp/prometheus.yml" || fail "promtool check config $prom"
  promtool check rules "$alerts" || fail "promtool check rules $alerts"
  for a in GradlaneLinkSaturated GradlanePeerDown GradlaneErrorsRising; do
    grep -q "alert: $a\$" "$alerts" || fail "alert $a missing"
  done
else
  echo "SKIP part: promtool not installed (Debian package prometheus; deploy/install-deps.sh)"
fi

if command -v systemd-analyze >/dev/null; then
  ran=1
  sed "s#^ExecStart=[^ ]*/gradlaned #ExecStart=$daemon #" "$unit" >"$tmp/gradlaned.service"
  grep -q "^ExecStart=$daemon --flagfile=" "$tmp/gradlaned.service" || fail "unit: ExecStart not rewritten"
  out=$(systemd-analyze verify "$tmp/gradlaned.service" 2>&1) || fail "systemd-analyze verify: $out"
  [[ -z $out ]] || fail "systemd-analyze verify warns: $out"
  for k in "Type=notify" "WatchdogSec=" "Restart=on-failure" "ProtectSystem=strict" \
           "PrivateTmp=yes" "NoNewPrivileges=yes" "CapabilityBoundingSet=" \
           "AmbientCapabilities=" "LimitMEMLOCK=infinity" "RuntimeDirectory=gradlane"; do
    grep -q "^$k" "$unit" || fail "unit lacks $k"
  done
else
  echo "SKIP part: systemd-analyze not installed (Debian package systemd)"
fi

if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["panels"] and all(t["expr"] for p in d["panels"] for t in p["targets"])' "$dash"; then
  ran=1
else
  fail "dashboard $dash is not valid JSON with queries"
fi

# The example flagfile is accepted: gradlaned comes up with it (paths and ports overridden).
ran=1
"$daemon" --flagfile="$conf" --socket="$tmp/d.sock" --admin_socket="$tmp/d.admin.sock" \
  --listen=127.0.0.1:0 --metrics_address=127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
for ((i = 0; i < 100; i++)); do
  grep -q '^gradlaned ready ' "$tmp/out" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
grep -q '^gradlaned ready ' "$tmp/out" || fail "gradlaned does not start with $conf: $(cat "$tmp/err")"
kill -TERM $pid 2>/dev/null; wait $pid || fail "gradlaned exit status $? after SIGTERM"
pid=""

# sd_notify through libsystemd: READY=1 after the ready line, WATCHDOG=1 pings at half of
# WATCHDOG_USEC while the engine runs, STOPPING=1 on SIGTERM (a stand-in for systemd's socket).
python3 - "$daemon" "$tmp" <<'PYEOF' || fail "systemd notification"
import os, signal, socket, subprocess, sys, time
daemon, tmp = sys.argv[1], sys.argv[2]
path = os.path.join(tmp, "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(10)
env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
p = subprocess.Popen([daemon, "--socket=" + os.path.join(tmp, "n.sock"), "--listen=127.0.0.1:0"],
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
msgs = []
try:
    deadline = time.time() + 10
    while time.time() < deadline and sum(m.startswith("WATCHDOG=1") for m in msgs) < 3:
        msgs.append(s.recv(4096).decode())
    p.send_signal(signal.SIGTERM)
    while not any(m.startswith("STOPPING=1") for m in msgs):
        msgs.append(s.recv(4096).decode())
    p.wait(timeout=10)
finally:
    if p.poll() is None:
        p.kill()
        p.wait()
ready = [i for i, m in enumerate(msgs) if m.startswith("READY=1")]
pings = [i for i, m in enumerate(msgs) if m.startswith("WATCHDOG=1")]
ok = len(ready) == 1 and len(pings) >= 3 and ready[0] < pings[0] and msgs[-1].startswith("STOPPING=1")
print("sd_notify messages:", [m.split("\n")[0] for m in msgs])
sys.exit(0 if ok and p.returncode == 0 else 1)
PYEOF

((failed)) && exit 1
((ran)) || exit 77
echo "PASS deploy_check"
