#!/usr/bin/env bash
# allreduce_exact: ring all-reduce jobs (--mode=allreduce) through real daemons. On 4 hosts
# (network namespaces; loopback if none), jobs of W = 2, 3 and 4 ranks under every policy run
# tensors of every dtype with awkward sizes, posted whole and in byte ranges, and every rank's
# result must equal, bit for bit, the ring's fixed order (gradlane-check --mode=allreduce); then
# the mean; then the faults: a rank killed mid-iteration fails every survivor with an error
# completion (no hang), a wrong token is refused, a daemon killed mid-job fails every other rank
# within 2 x peer_timeout + 3 s, and a new job on the same daemons (one restarted) works. The
# daemons run --allreduce_fusion=off for those (the checker's reference follows each partition's
# chunks); then with fusion (greedy, which always fuses, and pace) on whole-number values, whose
# sums are exact in any order: every rank must get the exact sum, and the daemons must have fused.
#   allreduce_exact.sh GRADLANED GRADLANE-CHECK
#   env: IT_ITERATIONS (20), IT_POLICIES ("fifo p3 bytescheduler prophet gradlane"),
#        IT_FUSION_POLICIES (the fused jobs' policies: "p3 bytescheduler gradlane"),
#        GL_TRANSPORT (tcp; dpdk runs the same over the DPDK transport with injected loss)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
iters=${IT_ITERATIONS:-20}
part=65536  # --partition_bytes of every daemon: the check follows the ring within partitions
fault=()
if [[ ${GL_TRANSPORT:-tcp} == dpdk ]]; then
  fault=(--dpdk_fault_seed=1)
  GL_DPDK_FLAGS="--dpdk_drop_every=50 --dpdk_drop_probability=0.01 --dpdk_reorder_probability=0.02 --dpdk_duplicate_probability=0.01"
fi
sizes=--sizes=1,2,3,5,1023,16385,50001,123457

gl_env_init 4
for i in 0 1 2 3; do
  gl_daemon_start "$i" --reduce=sum --peer_timeout=3s --connect_timeout=4s --partition_bytes=$part --allreduce_fusion=off "${fault[@]}"
done
seed=500
for W in 2 3 4; do
  GL_W=$W
  for policy in ${IT_POLICIES:-fifo p3 bytescheduler prophet gradlane}; do
    seed=$((seed + 1))
    t0=$SECONDS
    # fifo sends whole tensors (the engine's cap is far above these sizes).
    p=$part
    [[ $policy == fifo ]] && p=$((64 << 20))
    it_job_start "ar$W-$policy" "$policy" "$iters" "$seed" -- --quiet --mode=allreduce \
      --ring_partition_bytes=$p "$sizes"
    it_job_wait "ar$W-$policy" 150 || it_fail "W=$W policy $policy: a rank failed (above)"
    echo "W=$W policy $policy: $W ranks x $iters iterations bit-exact ($((SECONDS - t0)) s)"
  done
done

# A rank killed in the middle of iteration 3: every survivor gets an error completion.
GL_W=3
it_job_start victim bytescheduler 20 11 "0 1" -- --mode=allreduce --ring_partition_bytes=$part \
  "$sizes" --expect_failure
it_job_start victim bytescheduler 20 11 "2" -- --mode=allreduce --ring_partition_bytes=$part \
  "$sizes" --stall_at=3
gl_wait_line "$GL_TMP/victim.r2.out" 'stalled at iteration 3' 60 "${GL_PID[victim.r2]}" ||
  { gl_show victim.r2; it_fail "rank 2 never reached its stall point"; }
sleep 0.5
kill -KILL "${GL_PID[victim.r2]}"
t0=$SECONDS
gl_wait victim.r2 5 || true
it_job_wait victim 30 "0 1" || it_fail "all-reduce survivors did not report the failure (above)"
echo "all-reduce survivors got error completions $((SECONDS - t0)) s after the kill"
for i in 0 1 2 3; do gl_daemon_alive "$i" || it_fail "daemon $i died after a client was killed"; done

# A rank with the wrong token: refused; the others fail by the connect deadline, nothing hangs.
it_job_start badtoken bytescheduler 3 12 "0 1" -- --mode=allreduce --ring_partition_bytes=$part \
  "$sizes" --expect_failure
IT_TOKEN_SAVED=$IT_TOKEN
IT_TOKEN=wrong-token
it_job_start badtoken bytescheduler 3 12 "2" -- --mode=allreduce --ring_partition_bytes=$part \
  "$sizes" --expect_failure
IT_TOKEN=$IT_TOKEN_SAVED
it_job_wait badtoken 60 || it_fail "wrong token: a rank did not report the failure (above)"
echo "wrong token: every rank failed cleanly"

# kill -9 of daemon 2 mid-job: ranks 0 and 1 get error completions within 2 x peer_timeout + 3 s,
# the other daemons stay up, and daemon 2 restarts for the next job.
it_job_start doomed bytescheduler 100000 15 -- --mode=allreduce --ring_partition_bytes=$part \
  "$sizes" --expect_failure
gl_wait_line "$GL_TMP/doomed.r0.out" 'iteration 3 ok' 60 "${GL_PID[doomed.r0]}" ||
  { gl_show doomed.r0; it_fail "job 'doomed' never reached iteration 3"; }
gl_daemon_stop 2 KILL || true
t0=$SECONDS
it_job_wait doomed $((2 * 3 + 3)) || it_fail "all-reduce ranks did not all report the daemon's death in time (above)"
echo "all-reduce ranks reported kill -9 of daemon 2 after $((SECONDS - t0)) s"
for i in 0 1 3; do gl_daemon_alive "$i" || it_fail "daemon $i died after daemon 2 was killed"; done
gl_daemon_start 2 --reduce=sum --peer_timeout=3s --connect_timeout=4s --partition_bytes=$part \
  --allreduce_fusion=off "${fault[@]}"

# The daemons go on: a new job runs bit-exact, then the mean.
it_job_start after prophet 5 13 -- --quiet --mode=allreduce --ring_partition_bytes=$part "$sizes"
it_job_wait after 60 || it_fail "a new all-reduce job after the faults failed (above)"
for i in 0 1 2 3; do
  gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"
  if [[ ${GL_TRANSPORT:-tcp} == dpdk ]]; then
    line=$(grep -m1 'dpdk stats:' "$GL_TMP/daemon$i.err") || it_fail "daemon $i printed no dpdk stats line"
    [[ $line =~ retransmits=([0-9]+) ]] && ((BASH_REMATCH[1] > 0)) ||
      it_fail "daemon $i retransmitted nothing: the loss was not exercised"
  fi
done
for i in 0 1 2; do
  gl_daemon_start "$i" --reduce=mean --peer_timeout=3s --connect_timeout=4s --partition_bytes=$part --allreduce_fusion=off "${fault[@]}"
done
it_job_start ar-mean bytescheduler 5 14 -- --quiet --mode=allreduce --reduce=mean \
  --ring_partition_bytes=$part "$sizes"
it_job_wait ar-mean 60 || it_fail "--reduce=mean all-reduce: a rank failed (above)"
echo "all-reduce reduce=mean: bit-exact"
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done

# Fused: small tensors go in ring buckets from the third iteration on.
for fusion in greedy pace; do
  for i in 0 1 2 3; do
    gl_daemon_start "$i" --peer_timeout=3s --connect_timeout=4s --partition_bytes=$part \
      --allreduce_fusion=$fusion "${fault[@]}"
  done
  for W in 3 4; do
    GL_W=$W
    for policy in ${IT_FUSION_POLICIES:-p3 bytescheduler gradlane}; do
      seed=$((seed + 1))
      it_job_start "fused-$fusion$W-$policy" "$policy" "$iters" "$seed" -- --quiet --mode=allreduce \
        --values=integer "$sizes"
      it_job_wait "fused-$fusion$W-$policy" 150 || it_fail "fusion $fusion W=$W policy $policy: a rank failed (above)"
    done
  done
  for i in 0 1 2 3; do
    gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"
    buckets=$(grep -o 'go fused in [0-9]* ring buckets' "$GL_TMP/daemon$i.err" | awk '{ s += $4 } END { print s + 0 }')
    [[ $fusion != greedy ]] || ((buckets > 0)) || it_fail "daemon $i: greedy fusion made no bucket"
    echo "fusion $fusion, daemon $i: $buckets buckets over its jobs, every result exact"
  done
done
echo "PASS allreduce_exact ($GL_MODE, ${GL_TRANSPORT:-tcp})"
