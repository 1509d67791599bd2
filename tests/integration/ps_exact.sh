#!/usr/bin/env bash
# ps_exact: 3 hosts (network namespaces; loopback if none), one daemon each; for every policy
# (fifo, p3, bytescheduler, prophet, gradlane) a job of 3 gradlane-check ranks runs 50 iterations of
# tensors of every dtype with awkward sizes, posted whole and in byte ranges, and every result
# must equal, bit for bit, the rank-ordered f32 sum (f16/bf16 rounded once). Then the same with
# daemons started with --reduce=mean (5 iterations).
#   ps_exact.sh GRADLANED GRADLANE-CHECK
#   env: IT_ITERATIONS (50), IT_BIG_MB (0: off; else one more tensor of that many MiB + 1
#        element per dtype), IT_POLICIES ("fifo p3 bytescheduler prophet gradlane")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
iters=${IT_ITERATIONS:-50}
big=() dflags=()
if [[ -n ${IT_BIG_MB:-} && ${IT_BIG_MB:-0} != 0 ]]; then
  big=(--big_mb="$IT_BIG_MB")
  dflags=(--max_arena_bytes=$(((4 * IT_BIG_MB + 64) << 20)))
fi

gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --reduce=sum --peer_timeout=10s "${dflags[@]}"; done
seed=100
for policy in ${IT_POLICIES:-fifo p3 bytescheduler prophet gradlane}; do
  seed=$((seed + 1))
  t0=$SECONDS
  # fifo sends whole tensors and p3 cuts at 50,000 elements: the 4 MiB-boundary tensors of the
  # default set only matter to the 4 MiB-partition policies, and cost half the run time.
  sizes=()
  [[ $policy == fifo || $policy == p3 ]] && sizes=(--sizes=1,3,1023,50001,123457,300001)
  it_job_start "exact-$policy" "$policy" "$iters" "$seed" -- --quiet "${sizes[@]}" "${big[@]}"
  it_job_wait "exact-$policy" 150 || it_fail "policy $policy: a rank failed (above)"
  echo "policy $policy: 3 ranks x $iters iterations bit-exact ($((SECONDS - t0)) s)"
done
folded=0 direct=0 staged=0
for i in 0 1 2; do
  gl_daemon_alive "$i" || it_fail "daemon $i died"
  gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"
  line=$(grep -m1 'engine stats:' "$GL_TMP/daemon$i.err") || it_fail "daemon $i printed no engine stats line"
  [[ $line =~ rounds_folded=([0-9]+) ]] && folded=$((folded + BASH_REMATCH[1]))
  [[ $line =~ \ device_tensors=([0-9]+) ]] && direct=$((direct + BASH_REMATCH[1]))
  [[ $line =~ device_registrations_refused=([0-9]+) ]] && staged=$((staged + BASH_REMATCH[1]))
done
# IT_EXPECT_GPUDIRECT=1 (gpu_exact.sh on a host with a GPU and an RDMA NIC): the device tensors'
# GPU memory must have been registered with the NIC, none refused.
if [[ ${IT_EXPECT_GPUDIRECT:-0} == 1 ]]; then
  why=$(grep -h 'staged through shared memory' "$GL_TMP"/daemon*.err | head -1 || true)
  ((direct > 0 && staged == 0)) || it_fail "GPUDirect: $direct device tensors sent from GPU memory, $staged refused by the NIC (want all sent from it)${why:+: $why}${why:- (none offered: the client found the GPU unable; gl_testing_gpudirect says why)}"
  echo "GPUDirect: $direct device tensors (summed over the daemons) sent from and into GPU memory"
fi
# A backend that hands packets over (DPDK) reduces pushes as they arrive: the runs above must
# have taken that path, and were bit-exact. TCP places whole segments and never folds.
if [[ ${GL_TRANSPORT:-tcp} == dpdk ]]; then
  ((folded > 0)) || it_fail "no daemon folded a round over DPDK"
  echo "rounds folded on arrival: $folded"
else
  ((folded == 0)) || it_fail "$folded rounds folded over ${GL_TRANSPORT:-tcp}, which places whole segments"
fi

for i in 0 1 2; do gl_daemon_start "$i" --reduce=mean --peer_timeout=10s; done
it_job_start "exact-mean" bytescheduler 5 7 -- --quiet --reduce=mean
it_job_wait "exact-mean" 60 || it_fail "--reduce=mean: a rank failed (above)"
echo "reduce=mean: bit-exact"
echo "PASS ps_exact ($GL_MODE)"
