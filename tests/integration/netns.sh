# tests/integration/netns.sh — a sourced bash library: W emulated hosts for end-to-end tests.
#
# Each host is a network namespace gl<i>-<uniq> with one interface eth0 (192.168.77.<i+1>/24)
# whose veth peer sits in a switch namespace glsw-<uniq> on a bridge. Nothing is routed out: the
# addresses exist only inside namespaces this library creates. Optionally every host's link is
# shaped with `tc tbf` in both directions (uplink: eth0 egress in the host; downlink: the switch
# port's egress). Where namespaces cannot be created (not root, no CAP_NET_ADMIN, or
# GL_FORCE_LOOPBACK=1) the hosts are all 127.0.0.1 with their own ports and sockets, and the
# library says so; a caller that needs namespaces gets exit code 77 (meson's "skipped").
# GL_VETH_RPS=MASK (e.g. 3) sets that RPS CPU mask on every veth end: a veth hands each frame to
# the backlog of the CPU that sent it, so a flow whose sender moves between CPUs arrives
# reordered (TCP then retransmits spuriously); RPS keeps each flow on one CPU's backlog, at
# some kernel CPU (docs/benchmarks.md, "Why TCP retransmits here"). Off by default.
#
# Guarantees: every wait is bounded; `gl_cleanup` (installed as an EXIT trap by `gl_env_init`,
# also run on INT/TERM) kills every process the library started and every process left in its
# namespaces, deletes the namespaces and the temporary directory — also when the caller fails.
#
# API (after `source`):
#   gl_env_init [--need-netns] W [RATE]  create W hosts; RATE like 3gbit shapes every link
#   gl_shape RATE                 (re)shape every link ("": unshaped)
#   gl_daemon_start I [FLAGS...]  start gradlaned on host I; waits for its ready line; sets
#                                 GL_SOCK[I], GL_ADDR[I] (host:port), GL_DPID[I]
#                                 (GL_TRANSPORT=dpdk: over DPDK net_af_packet, gl_dpdk_flags;
#                                 GL_TRANSPORT=verbs: RDMA, + GL_VERBS_FLAGS)
#   gl_daemon_stop I [SIGNAL]     signal (default TERM) and reap, bounded
#   gl_peers                      "addr0,addr1,..." of the running daemons
#   gl_bg I NAME CMD...           run CMD in host I in the background, output in
#                                 $GL_TMP/NAME.out/.err; pid in GL_PID[NAME]
#   gl_exec I CMD...              run CMD in host I in the foreground
#   gl_wait NAME TIMEOUT_S        wait for GL_PID[NAME]; returns its exit code, 124 on timeout
#                                 (the process is then killed)
#   gl_wait_line FILE REGEX TIMEOUT_S [PID]  wait until FILE has a line matching REGEX
#   gl_show NAME                  print the tail of a background process's output
# Variables: GL_DAEMON (path to gradlaned, required for gl_daemon_start), GL_MODE (netns |
# loopback), GL_TMP, GL_UNIQ, GL_W, GL_RATE, GL_MTU (default 9000), GL_READY_TIMEOUT (60 s: only a daemon that hangs at start reaches it).

GL_MODE=""
GL_TMP=""
GL_UNIQ=""
GL_W=0
GL_RATE=""
GL_MTU=${GL_MTU:-9000}
GL_READY_TIMEOUT=${GL_READY_TIMEOUT:-60}
GL_SUBNET=192.168.77
declare -a GL_NS=()
declare -a GL_IP=()
declare -a GL_SOCK=()
declare -a GL_ADDR=()
declare -a GL_DPID=()
declare -A GL_PID=()
GL_SWITCH=""
GL_CLEANED=0

gl_log() { echo "[netns] $*" >&2; }

# Rate like 3gbit / 500mbit / 100kbit / 1e9 -> bits per second (integer), or empty if malformed.
gl_rate_bps() {
  local r=${1,,} n unit
  if [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)?$ ]]; then
    n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[3]:-bit}
    case $unit in
      bit) awk -v n="$n" 'BEGIN{printf "%.0f", n}' ;;
      kbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e3}' ;;
      mbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e6}' ;;
      gbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e9}' ;;
      tbit) awk -v n="$n" 'BEGIN{printf "%.0f", n*1e12}' ;;
    esac
  fi
}

# Kills pid with TERM, then KILL after `grace` seconds; reaps it if it is our child.
gl_kill_pid() {
  local pid=$1 grace=${2:-2} i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

gl_cleanup() {
  ((GL_CLEANED)) && return 0
  GL_CLEANED=1
  set +e
  local name pid ns p
  for name in "${!GL_PID[@]}"; do gl_kill_pid "${GL_PID[$name]}" 1; done
  for pid in "${GL_DPID[@]}"; do [[ -n $pid ]] && gl_kill_pid "$pid" 2; done
  for ns in "${GL_NS[@]}" "$GL_SWITCH"; do
    [[ -z $ns || $GL_MODE != netns ]] && continue
    # Anything still running inside our namespaces was started by us: kill it.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  if [[ -n $GL_TMP && -d $GL_TMP && -z ${GL_KEEP_TMP:-} ]]; then rm -rf "$GL_TMP"; fi
  return 0
}

gl_on_exit() {
  local rc=$?
  if ((rc != 0 && rc != 77)) && [[ -n $GL_TMP && -d $GL_TMP ]]; then
    gl_log "failed (exit $rc); logs:"
    local f
    for f in "$GL_TMP"/*.out "$GL_TMP"/*.err; do
      [[ -s $f ]] || continue
      echo "----- ${f##*/} (last 15 lines)" >&2
      tail -n 15 "$f" >&2
    done
  fi
  gl_cleanup
  exit "$rc"
}

# gl_env_init [--need-netns] W [RATE]
gl_env_init() {
  local need=0
  if [[ ${1:-} == --need-netns ]]; then need=1; shift; fi
  GL_W=$1
  GL_RATE=${2:-}
  GL_UNIQ="$$-$RANDOM"
  GL_TMP=$(mktemp -d "/tmp/gradlane-it.XXXXXX")
  trap gl_on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local i
  if [[ -z ${GL_FORCE_LOOPBACK:-} ]] && ip netns add "glsw-$GL_UNIQ" 2>/dev/null; then
    GL_MODE=netns
    GL_SWITCH="glsw-$GL_UNIQ"
    ip -n "$GL_SWITCH" link add br0 type bridge
    # A switch forwards frames; it does not run the firewall. Where the host has br_netfilter
    # loaded (container runtimes load it), every bridged frame would also pass through iptables
    # in the switch namespace (measured: about 8% of a DPDK daemon's CPU at 10 Gbit/s, paid in
    # the sender's context). The setting is per namespace; absent without br_netfilter.
    ip netns exec "$GL_SWITCH" sysctl -qw net.bridge.bridge-nf-call-iptables=0 \
      net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0 2>/dev/null || true
    ip -n "$GL_SWITCH" link set br0 mtu "$GL_MTU" up
    for ((i = 0; i < GL_W; i++)); do
      GL_NS[i]="gl$i-$GL_UNIQ"
      GL_IP[i]="$GL_SUBNET.$((i + 1))"
      ip netns add "${GL_NS[i]}"
      ip link add eth0 netns "${GL_NS[i]}" type veth peer name "p$i" netns "$GL_SWITCH"
      ip -n "$GL_SWITCH" link set "p$i" mtu "$GL_MTU" master br0 up
      ip -n "${GL_NS[i]}" link set lo up
      ip -n "${GL_NS[i]}" link set eth0 mtu "$GL_MTU" up
      ip -n "${GL_NS[i]}" addr add "${GL_IP[i]}/24" dev eth0
      if [[ -n ${GL_VETH_RPS:-} ]]; then
        ip netns exec "${GL_NS[i]}" sh -c "echo $GL_VETH_RPS > /sys/class/net/eth0/queues/rx-0/rps_cpus" &&
          ip netns exec "$GL_SWITCH" sh -c "echo $GL_VETH_RPS > /sys/class/net/p$i/queues/rx-0/rps_cpus" ||
          gl_log "GL_VETH_RPS=$GL_VETH_RPS: could not set the RPS mask of host $i's veth (left as it was)"
      fi
    done
    if [[ -n $GL_RATE ]]; then gl_shape "$GL_RATE" || return 2; fi
    # (no ping here: a TCP connect to a closed port answers "refused" once the path works).
    local out
    for ((i = 1; i < GL_W; i++)); do
      out=$(ip netns exec "${GL_NS[0]}" timeout 3 bash -c "exec 3<>/dev/tcp/${GL_IP[i]}/9" 2>&1) || true
      if [[ $out != *refused* && -n $out ]]; then
        gl_log "host ${GL_IP[i]} unreachable from host 0: $out"
        return 1
      fi
    done
    gl_log "$GL_W hosts in network namespaces ${GL_NS[*]} (switch $GL_SWITCH, mtu $GL_MTU${GL_RATE:+, tbf $GL_RATE each way})"
  else
    GL_MODE=loopback
    if [[ ${GL_TRANSPORT:-tcp} == dpdk ]]; then
      gl_log "SKIP: the DPDK transport tests need network namespaces (root / CAP_NET_ADMIN) for net_af_packet on veth"
      exit 77
    fi
    if ((need)); then
      gl_log "SKIP: cannot create network namespaces (need root / CAP_NET_ADMIN)${GL_FORCE_LOOPBACK:+ (GL_FORCE_LOOPBACK set)}"
      exit 77
    fi
    for ((i = 0; i < GL_W; i++)); do GL_NS[i]=""; GL_IP[i]=127.0.0.1; done
    gl_log "network namespaces unavailable${GL_FORCE_LOOPBACK:+ (GL_FORCE_LOOPBACK set)}: falling back to loopback (127.0.0.1, one port per daemon)${GL_RATE:+; rate $GL_RATE NOT applied}"
  fi
}

# gl_shape RATE : (re)shapes every host's link to RATE each way with tbf; "" removes shaping.
# Namespaces only (a no-op with a message on loopback).
gl_shape() {
  local rate=$1 bps burst i
  if [[ $GL_MODE != netns ]]; then
    gl_log "loopback: cannot shape to '$rate'"
    return 0
  fi
  for ((i = 0; i < GL_W; i++)); do
    tc -n "${GL_NS[i]}" qdisc del dev eth0 root 2>/dev/null || true
    tc -n "$GL_SWITCH" qdisc del dev "p$i" root 2>/dev/null || true
  done
  GL_RATE=$rate
  [[ -z $rate ]] && return 0
  bps=$(gl_rate_bps "$rate")
  [[ -n $bps && $bps -gt 0 ]] || { gl_log "bad rate '$rate'"; return 2; }
  # Bucket: 4 ms of the rate, at least 4 frames (measured here with iperf3 at 3gbit: a 1 ms
  # bucket delivers 2.77 Gbit/s, 4 ms 2.86, 16 ms 2.98); latency bounds the queue.
  burst=$((bps / 8 / 250))
  ((burst < 4 * GL_MTU)) && burst=$((4 * GL_MTU))
  for ((i = 0; i < GL_W; i++)); do
    tc -n "${GL_NS[i]}" qdisc add dev eth0 root tbf rate "$bps" burst "$burst" latency 50ms
    tc -n "$GL_SWITCH" qdisc add dev "p$i" root tbf rate "$bps" burst "$burst" latency 50ms
  done
}

# gl_exec I CMD... : runs CMD in host I.
gl_exec() {
  local i=$1; shift
  if [[ $GL_MODE == netns ]]; then
    ip netns exec "${GL_NS[i]}" "$@"
  else
    "$@"
  fi
}

# gl_bg I NAME CMD... : background CMD in host I; output to $GL_TMP/NAME.{out,err}.
gl_bg() {
  local i=$1 name=$2; shift 2
  if [[ $GL_MODE == netns ]]; then
    ip netns exec "${GL_NS[i]}" "$@" >"$GL_TMP/$name.out" 2>"$GL_TMP/$name.err" &
  else
    "$@" >"$GL_TMP/$name.out" 2>"$GL_TMP/$name.err" &
  fi
  GL_PID[$name]=$!
}

# gl_wait NAME TIMEOUT_S : exit code of the background process NAME, 124 if it had to be killed.
gl_wait() {
  local name=$1 timeout=$2 pid=${GL_PID[$1]} rc=0 deadline
  deadline=$((SECONDS + timeout))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      gl_log "$name (pid $pid) still running after ${timeout}s: killing it"
      gl_kill_pid "$pid" 1
      unset "GL_PID[$name]"
      return 124
    fi
    sleep 0.05
  done
  wait "$pid" 2>/dev/null || rc=$?
  unset "GL_PID[$name]"
  return "$rc"
}

# gl_wait_line FILE REGEX TIMEOUT_S [PID] : 0 when a line matches; 1 on timeout or if PID died.
gl_wait_line() {
  local file=$1 re=$2 timeout=$3 pid=${4:-} deadline
  deadline=$((SECONDS + timeout))
  while ! grep -Eq -- "$re" "$file" 2>/dev/null; do
    if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
      grep -Eq -- "$re" "$file" 2>/dev/null && return 0
      return 1
    fi
    ((SECONDS >= deadline)) && return 1
    sleep 0.05
  done
  return 0
}

gl_show() {
  local name=$1 n=${2:-20}
  echo "--- $name stdout:" >&2
  tail -n "$n" "$GL_TMP/$name.out" >&2 2>/dev/null || true
  echo "--- $name stderr:" >&2
  tail -n "$n" "$GL_TMP/$name.err" >&2 2>/dev/null || true
}

# gl_daemon_start I [FLAGS...]
gl_daemon_start() {
  local i=$1; shift
  [[ -x ${GL_DAEMON:-} ]] || { gl_log "GL_DAEMON='${GL_DAEMON:-}' is not an executable"; return 1; }
  local name="daemon$i" sock="$GL_TMP/d$i.sock" line pid
  # A restarted daemon keeps its log of the previous run.
  [[ -f $GL_TMP/$name.out ]] && mv "$GL_TMP/$name.out" "$GL_TMP/$name.prev.out" \
    && mv "$GL_TMP/$name.err" "$GL_TMP/$name.prev.err"
  rm -f "$sock"
  local transport=()
  [[ ${GL_TRANSPORT:-tcp} == dpdk ]] && transport=($(gl_dpdk_flags "$i"))
  # Verbs: every host's daemon on the one RDMA device (soft-RoCE on lo in tests/rxe's guest).
  [[ ${GL_TRANSPORT:-tcp} == verbs ]] && transport=(--transport=verbs ${GL_VERBS_FLAGS:-})
  gl_bg "$i" "$name" "$GL_DAEMON" --socket="$sock" --listen="${GL_IP[i]}:0" "$@" "${transport[@]}"
  pid=${GL_PID[$name]}
  unset "GL_PID[$name]"
  GL_DPID[i]=$pid
  if ! gl_wait_line "$GL_TMP/$name.out" '^gradlaned ready ' "$GL_READY_TIMEOUT" "$pid"; then
    gl_log "gradlaned on host $i not ready within ${GL_READY_TIMEOUT}s (pid $pid)"
    gl_show "$name"
    return 1
  fi
  line=$(grep -m1 -E '^gradlaned ready ' "$GL_TMP/$name.out")
  if [[ ! $line =~ ^gradlaned\ ready\ socket=([^ ]+)\ listen=([^ ]+)$ ]]; then
    gl_log "host $i: malformed ready line: '$line'"
    return 1
  fi
  GL_SOCK[i]=${BASH_REMATCH[1]}
  GL_ADDR[i]=${BASH_REMATCH[2]}
  if [[ ${GL_SOCK[i]} != "$sock" || ${GL_ADDR[i]} == *:0 ]]; then
    gl_log "host $i: ready line '$line' does not match --socket=$sock --listen=${GL_IP[i]}:0"
    return 1
  fi
}

# With GL_TRANSPORT=dpdk: the daemon drives host I's eth0 through DPDK's net_af_packet (tx
# through the qdisc, so tbf applies: qdisc_bypass=0) at an address the kernel does not own
# (.101, .102, ...), so the kernel drops our UDP instead of answering it; we answer ARP for it.
# GL_DPDK_FLAGS adds flags (e.g. fault injection) to every daemon.
gl_dpdk_flags() {
  local i=$1
  echo "--transport=dpdk --listen=$GL_SUBNET.$((i + 101)):7610 --dpdk_memory_mb=256 --dpdk_mtu=$GL_MTU" \
    "--dpdk_vdev=net_af_packet$i,iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512" \
    "--dpdk_file_prefix=gl$i-$GL_UNIQ --dpdk_lcore=$((i % $(nproc))) ${GL_DPDK_FLAGS:-}"
}

# gl_daemon_stop I [SIGNAL] : returns the daemon's exit status (124 if it had to be killed).
gl_daemon_stop() {
  local i=$1 sig=${2:-TERM} pid=${GL_DPID[$1]} rc=0 k
  [[ -n $pid ]] || return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  for ((k = 0; k < 100; k++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    gl_log "gradlaned on host $i did not exit within 5 s of SIG$sig"
    gl_kill_pid "$pid" 0
    rc=124
  else
    wait "$pid" 2>/dev/null || rc=$?
  fi
  GL_DPID[i]=""
  return "$rc"
}

gl_daemon_alive() { [[ -n ${GL_DPID[$1]} ]] && kill -0 "${GL_DPID[$1]}" 2>/dev/null; }

gl_peers() {
  local IFS=,
  echo "${GL_ADDR[*]:0:GL_W}"  # the job's ranks: a job may use the first W of the hosts
}
