// transport/verbs/verbs_options.h — how the verbs backend is configured (gradlaned's --verbs_*
// flags). Free of libibverbs, so the daemon's flag parsing builds on hosts without rdma-core.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_OPTIONS_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_OPTIONS_H_

#include <cstdint>
#include <string>

#include "transport/verbs/verbs_channel.h"

namespace gradlane::transport::verbs {

struct VerbsOptions {
  std::string device;  // empty: the first RDMA device
  uint8_t port = 1;
  int gid_index = 1;  // soft-RoCE on IPv4: 1; `show_gids` lists a real NIC's table
  ChannelLimits limits;
};

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_OPTIONS_H_
