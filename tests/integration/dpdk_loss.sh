#!/usr/bin/env bash
# dpdk_loss: the DPDK transport repairs loss. 3 hosts over net_af_packet (netns.sh, GL_TRANSPORT=
# dpdk); every daemon drops every 50th datagram it sends plus 1% at random, reorders 2% and
# duplicates 1% (the protocol's transmit-side fault injection; `tc netem` does not exist here).
# Jobs under p3 (stop-and-wait: every loss stalls) and bytescheduler must stay bit-exact and finish
# (no hang), and every daemon's exit line must show faults injected and retransmissions made.
#   dpdk_loss.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
GL_TRANSPORT=dpdk
GL_DPDK_FLAGS="--dpdk_drop_every=50 --dpdk_drop_probability=0.01 --dpdk_reorder_probability=0.02 --dpdk_duplicate_probability=0.01"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=10s --dpdk_fault_seed=$((i + 1)); done
seed=300
for policy in p3 bytescheduler; do
  seed=$((seed + 1))
  t0=$SECONDS
  it_job_start "loss-$policy" "$policy" "${IT_ITERATIONS:-10}" "$seed" -- --quiet --sizes=1,1023,50001,300001,1048577
  it_job_wait "loss-$policy" 120 || it_fail "policy $policy under loss: a rank failed (above)"
  echo "policy $policy: bit-exact under loss ($((SECONDS - t0)) s)"
done
for i in 0 1 2; do
  gl_daemon_alive "$i" || it_fail "daemon $i died"
  gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"
  line=$(grep -m1 'dpdk stats:' "$GL_TMP/daemon$i.err") || it_fail "daemon $i printed no dpdk stats line"
  echo "daemon $i: ${line#*dpdk stats: }"
  [[ $line =~ injected_drops=([0-9]+) ]] && ((BASH_REMATCH[1] > 0)) || it_fail "daemon $i injected no drops"
  [[ $line =~ retransmits=([0-9]+) ]] && ((BASH_REMATCH[1] > 0)) || it_fail "daemon $i retransmitted nothing"
  # Pushes are folded into the reduction packet by packet (retransmitted, reordered and
  # duplicated packets included): the bit-exact results above cover that path.
  line=$(grep -m1 'engine stats:' "$GL_TMP/daemon$i.err") || it_fail "daemon $i printed no engine stats line"
  echo "daemon $i: ${line#*engine stats: }"
  [[ $line =~ rounds_folded=([0-9]+) ]] && ((BASH_REMATCH[1] > 0)) || it_fail "daemon $i folded no round"
done
echo "PASS dpdk_loss"
