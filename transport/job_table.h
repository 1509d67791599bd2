// transport/job_table.h — moved to transport/common/job_table.h. This forwarding header stays
// only while transport/dpdk/reliable_transport.h (being split into transport/datagram/) still
// includes the old path; delete it when that lands on transport/common/.
#ifndef GRADLANE_TRANSPORT_JOB_TABLE_H_
#define GRADLANE_TRANSPORT_JOB_TABLE_H_

#include "transport/common/job_table.h"

#endif  // GRADLANE_TRANSPORT_JOB_TABLE_H_
