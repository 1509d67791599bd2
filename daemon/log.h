// daemon/log.h — the daemon's one logger: a line to stderr with a UTC timestamp (systemd's
// journal keeps it). Any thread; lines are written whole.
#ifndef GRADLANE_DAEMON_LOG_H_
#define GRADLANE_DAEMON_LOG_H_

#include <string>

namespace gradlane::daemon {

void LogLine(const std::string& line);

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_LOG_H_
