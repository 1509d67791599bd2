// transport/common/job_table.h — the jobs a transport backend serves: each job's credentials (id,
// local rank, world size, token) by id, at an index a connection keeps for its lifetime.
//
// Shared by every backend (TCP, the datagram protocol under DPDK, the test fake) so they check
// credentials the same way and give the same errors. Entries are never moved: a removed job's entry
// is marked inactive and reused by a later Add, so an index held by a connection of a removed job
// still names valid memory (the backend closes those connections when it removes the job). Thread
// rules: the engine thread that owns the backend (control path; allocates).
#ifndef GRADLANE_TRANSPORT_COMMON_JOB_TABLE_H_
#define GRADLANE_TRANSPORT_COMMON_JOB_TABLE_H_

#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "transport/transport.h"

namespace gradlane::transport {

class JobTable {
 public:
  struct Entry {
    bool active = false;
    JobCredentials creds;
  };

  // Checks the credentials and adds the job. InvalidArgument for a token longer than
  // kMaxTokenBytes or a rank outside the world; AlreadyExists if the id is already served.
  absl::Status Add(const JobCredentials& job) {
    if (job.token.size() > kMaxTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat("auth token of job ", job.job_id,
                                                     " is longer than ", kMaxTokenBytes, " bytes"));
    }
    if (job.world_size == 0 || job.local_rank >= job.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id, ": rank ", job.local_rank,
                                                     " out of range for world size ",
                                                     job.world_size));
    }
    if (Find(job.job_id) >= 0) {
      return absl::AlreadyExistsError(absl::StrCat("job ", job.job_id, " already added"));
    }
    for (Entry& e : entries_) {
      if (!e.active) {
        e = Entry{true, job};
        return absl::OkStatus();
      }
    }
    entries_.push_back(Entry{true, job});
    return absl::OkStatus();
  }

  // The index of the active job with this id, or -1.
  int Find(uint64_t job_id) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].active && entries_[i].creds.job_id == job_id) return static_cast<int>(i);
    }
    return -1;
  }

  // RemoveJob_st for every backend: NotFound for a job not added; otherwise
  // close_connections(index, why) closes the job's connections — failing their pending sends
  // and reporting them down with `why` (Cancelled), synchronously — and then the job is no
  // longer served (its hellos and dials are refused from then on).
  template <class CloseConnections>
  absl::Status Remove(uint64_t job_id, CloseConnections&& close_connections) {
    const int j = Find(job_id);
    if (j < 0) return absl::NotFoundError(absl::StrCat("job ", job_id, " not added"));
    close_connections(j, absl::CancelledError(absl::StrCat("job ", job_id, " removed")));
    Deactivate(j);
    return absl::OkStatus();
  }
  // Connect_st's lookup: the index, or FailedPrecondition (AddJob_st must come first).
  absl::StatusOr<int> FindToDial(uint64_t job_id) const {
    const int j = Find(job_id);
    if (j < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " must be added (AddJob_st) before connecting"));
    }
    return j;
  }

  void Deactivate(int index) { entries_[static_cast<size_t>(index)].active = false; }

  const Entry& operator[](int index) const { return entries_[static_cast<size_t>(index)]; }

  // What the handler is told about a connection: its handle, its job's id (0 while it has none:
  // an inbound connection before its hello), the peer's rank and the direction.
  PeerInfo PeerInfoOf(PeerHandle handle, int job_index, uint16_t peer_rank, bool inbound) const {
    PeerInfo p;
    p.handle = handle;
    p.job_id = job_index >= 0 ? (*this)[job_index].creds.job_id : 0;
    p.rank = peer_rank;
    p.inbound = inbound;
    return p;
  }

 private:
  std::deque<Entry> entries_;  // a deque: growing never moves an entry
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COMMON_JOB_TABLE_H_
