// transport/verbs/verbs_counters.h — the counters of the RDMA verbs data path (what the protocol
// core in verbs_channel.h does: eager sends, rendezvous steps, credits, replies, completions) and
// of the device's memory registrations, declared once as lists in the style of
// transport/counters.h: X(name, type, metric, label, help).
//
// Why a list of its own rather than entries in transport/counters.h: those are kept by every
// backend; these exist only with --transport=verbs. The verbs backend reports them through
// Transport::DescribeBackend (transport/transport.h), from which the Prometheus families
// (daemon/metrics.cc), the admin socket's status reply and `gradlanectl counters` are built, each
// under its name prefixed "verbs_". docs/verbs.md says what each one means.
//
// Thread rules: the data-path counters (VerbsCounters) are written by the engine thread only
// (StatCounter: a relaxed load+store, no locked instruction per request), read by any. The
// registration counters (RegistrationCounters) are written by whichever thread registers memory
// (libibverbs allows any; registration is a control-path call costing microseconds to
// milliseconds), so they are atomic read-modify-writes. No dependencies beyond the standard
// library and transport/counters.h.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_COUNTERS_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "transport/counters.h"

// The data path, summed over every connection this transport ever had. The sender's side first
// (the dialer's end of a connection), then the receiver's, then both.
#define GRADLANE_VERBS_COUNTERS(X) \
  X(eager_sends, Counter, "gradlane_verbs_eager_sends_total", "", \
    "eager segments sent: one SEND of the frame header and the payload") \
  X(eager_bytes, Counter, "gradlane_verbs_eager_sent_bytes_total", "", \
    "payload bytes of the eager segments sent") \
  X(rendezvous_headers, Counter, "gradlane_verbs_rendezvous_total", "step=header", \
    "rendezvous segments whose header was sent (a SEND of the header alone)") \
  X(clear_to_send, Counter, "gradlane_verbs_rendezvous_total", "step=clear_to_send", \
    "clear-to-send replies the sender read (the receiver chose a target)") \
  X(rendezvous_writes, Counter, "gradlane_verbs_rendezvous_total", "step=write", \
    "RDMA WRITEs with immediate posted: a rendezvous segment's payload into its target") \
  X(rendezvous_bytes, Counter, "gradlane_verbs_rendezvous_written_bytes_total", "", \
    "payload bytes of the rendezvous writes posted") \
  X(segments_acked, Counter, "", "", \
    "segments the receiver holds (an eager ack read, or a rendezvous write completed)") \
  X(segments_failed, Counter, "", "", \
    "segments that will never be acknowledged (refused, or their channel failed)") \
  X(credit_stalls, Counter, "gradlane_verbs_credit_stalls_total", "", \
    "times a sender had a request due and no credit left: it waits for the receiver's next " \
    "credit write") \
  X(credits_available, Gauge, "gradlane_verbs_credits_available", "", \
    "receives the peers have posted that the senders have not used yet, summed over the " \
    "connections as each sender last read its credit word") \
  X(eager_received, Counter, "gradlane_verbs_eager_received_total", "", \
    "eager segments placed (copied from a receive slot into their target)") \
  X(eager_recv_bytes, Counter, "gradlane_verbs_eager_received_bytes_total", "", \
    "payload bytes of the eager segments placed") \
  X(rendezvous_received, Counter, "gradlane_verbs_rendezvous_received_total", "", \
    "rendezvous segments placed (their write with immediate landed)") \
  X(rendezvous_recv_bytes, Counter, "gradlane_verbs_rendezvous_received_bytes_total", "", \
    "payload bytes of the rendezvous segments placed") \
  X(segments_refused, Counter, "gradlane_verbs_segments_refused_total", "", \
    "segments the receiver had no target for (a refusal written back)") \
  X(receives_posted, Counter, "gradlane_verbs_receives_posted_total", "", \
    "receives posted (the first ones and each repost): the credits granted to senders") \
  X(replies_written, Counter, "gradlane_verbs_replies_written_total", "", \
    "replies written into senders' reply rings (ack, clear-to-send, refusal)") \
  X(credit_writes, Counter, "gradlane_verbs_credit_writes_total", "", \
    "credit words written into senders' reply regions") \
  X(completions, Counter, "gradlane_verbs_completions_total", "", \
    "completions polled from the completion queue, successful or not") \
  X(flushed_completions, Counter, "gradlane_verbs_error_completions_total", "status=flushed", \
    "completions flushed because their queue pair was already in error") \
  X(remote_access_errors, Counter, "gradlane_verbs_error_completions_total", \
    "status=remote_access", "completions with a remote access error (bad rkey or range)") \
  X(rnr_errors, Counter, "gradlane_verbs_error_completions_total", "status=receiver_not_ready", \
    "receiver-not-ready completions (the protocol's credits should make these impossible)") \
  X(retry_exceeded_errors, Counter, "gradlane_verbs_error_completions_total", \
    "status=retry_exceeded", "completions whose transport retries ran out (peer unreachable)") \
  X(local_errors, Counter, "gradlane_verbs_error_completions_total", "status=local", \
    "completions with any other error (length, protection, ...)") \
  X(channel_failures, Counter, "gradlane_verbs_channel_failures_total", "", \
    "connections failed by an error completion or by a peer that broke the protocol (not " \
    "counting those closed because their peer went down)") \
  X(queue_pairs, Gauge, "gradlane_verbs_queue_pairs", "", \
    "connected queue pairs with their protocol running (one per connection and direction)")

// Memory registrations with the device (every engine region, and each connection's reply ring,
// header staging, receive slots and reply staging).
#define GRADLANE_VERBS_REGISTRATION_COUNTERS(X) \
  X(registrations, Gauge, "gradlane_verbs_registrations", "", \
    "memory regions registered with the device now") \
  X(registered_bytes, Gauge, "gradlane_verbs_registered_bytes", "", \
    "bytes of memory registered with the device now") \
  X(registration_failures, Counter, "gradlane_verbs_registration_failures_total", "", \
    "registrations the device refused (ibv_reg_mr failed: locked-memory limit, bad range)")

namespace gradlane::transport::verbs {

struct VerbsStats {
#define GRADLANE_VERBS_STATS_FIELD(name, type, metric, label, help) uint64_t name = 0;
  GRADLANE_VERBS_COUNTERS(GRADLANE_VERBS_STATS_FIELD)
  GRADLANE_VERBS_REGISTRATION_COUNTERS(GRADLANE_VERBS_STATS_FIELD)
#undef GRADLANE_VERBS_STATS_FIELD
};

// The data path's counters: engine thread writes, any thread reads.
struct VerbsCounters {
#define GRADLANE_VERBS_COUNTER_FIELD(name, type, metric, label, help) StatCounter name;
  GRADLANE_VERBS_COUNTERS(GRADLANE_VERBS_COUNTER_FIELD)
#undef GRADLANE_VERBS_COUNTER_FIELD
  // Fills the data-path fields of `s` (the registration fields are left as they are).
  void SnapshotInto(VerbsStats& s) const {
#define GRADLANE_VERBS_SNAPSHOT_FIELD(name, type, metric, label, help) s.name = name.Get();
    GRADLANE_VERBS_COUNTERS(GRADLANE_VERBS_SNAPSHOT_FIELD)
#undef GRADLANE_VERBS_SNAPSHOT_FIELD
  }
};

// A counter any thread may change: an atomic read-modify-write (control path only).
class SharedCounter {
 public:
  void Add(uint64_t n) { v_.fetch_add(n, std::memory_order_relaxed); }
  void Sub(uint64_t n) { v_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

struct RegistrationCounters {
#define GRADLANE_VERBS_SHARED_FIELD(name, type, metric, label, help) SharedCounter name;
  GRADLANE_VERBS_REGISTRATION_COUNTERS(GRADLANE_VERBS_SHARED_FIELD)
#undef GRADLANE_VERBS_SHARED_FIELD
  void SnapshotInto(VerbsStats& s) const {
#define GRADLANE_VERBS_SNAPSHOT_FIELD(name, type, metric, label, help) s.name = name.Get();
    GRADLANE_VERBS_REGISTRATION_COUNTERS(GRADLANE_VERBS_SNAPSHOT_FIELD)
#undef GRADLANE_VERBS_SNAPSHOT_FIELD
  }
};

// Both lists as data, in order (what the backend's description iterates over).
#define GRADLANE_VERBS_INFO(name, type, metric, label, help) \
  {#name, CounterType::type, metric, label, help, &VerbsStats::name},
inline constexpr CounterInfo<VerbsStats> kVerbsCounters[] = {GRADLANE_VERBS_COUNTERS(
    GRADLANE_VERBS_INFO) GRADLANE_VERBS_REGISTRATION_COUNTERS(GRADLANE_VERBS_INFO)};
#undef GRADLANE_VERBS_INFO

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_COUNTERS_H_
