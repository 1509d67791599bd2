// transport/verbs/verbs_describe.h — what the verbs backend shows its readers (the metrics, the
// admin socket, gradlanectl) through Transport::DescribeBackend: its own counters
// (verbs_counters.h) as rows, and the RDMA device's port counters read from sysfs:
// /sys/class/infiniband/<device>/ports/<port>/counters/{port_xmit_data, port_rcv_data,
// port_xmit_packets, port_rcv_packets} (the InfiniBand port counters a NIC with a management
// agent has) and every file of hw_counters/ (driver-defined; soft-RoCE has sent_pkts, rcvd_pkts,
// rcvd_rnr_err, retry_exceeded_err, ...).
//
// Why sysfs: the port counters count what the NIC did, whoever asked (our queue pairs, perftest,
// another process), which our own counters cannot. They are read when a reader asks (a scrape,
// `gradlanectl status`) on that reader's thread, a few small files, never on the engine thread.
// A file or directory that is missing (soft-RoCE has no counters/, older kernels no
// hw_counters/) or unreadable is simply absent from the result, never an error.
// Pure: no libibverbs, so it is tested without a device, against a tree the test writes.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_DESCRIBE_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_DESCRIBE_H_

#include <string_view>
#include <vector>

#include "transport/transport.h"
#include "transport/verbs/verbs_counters.h"

namespace gradlane::transport::verbs {

inline constexpr std::string_view kSysfsInfiniband = "/sys/class/infiniband";

// Appends every counter of verbs_counters.h, in list order, named "verbs_" + its name, with its
// metric, label and help.
void AppendVerbsCounters(const VerbsStats& stats, std::vector<BackendCounterValue>& out);

// Appends the port's counters found under `root`/<device>/ports/<port>/ to `out`:
//   counters/port_{xmit,rcv}_data    -> verbs_port_{sent,received}_bytes (the files count 4-byte
//                                       words; the values are bytes), metric
//                                       gradlane_verbs_port_{sent,received}_bytes_total
//   counters/port_{xmit,rcv}_packets -> verbs_port_{sent,received}_packets,
//                                       gradlane_verbs_port_{sent,received}_packets_total
//   hw_counters/NAME                 -> verbs_hw_NAME, gradlane_verbs_hw_counters_total
//                                       {counter="NAME"} (except `lifespan`, a setting)
// each labelled device and port.
void AppendPortCounters(std::string_view root, std::string_view device, int port,
                        std::vector<BackendCounterValue>& out);

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_DESCRIBE_H_
