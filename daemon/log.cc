#include "daemon/log.h"

#include <time.h>

#include <cstdio>
#include <ctime>

namespace gradlane::daemon {

void LogLine(const std::string& line) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  ::gmtime_r(&ts.tv_sec, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  std::fprintf(stderr, "%s.%03ld gradlaned: %s\n", stamp, ts.tv_nsec / 1000000, line.c_str());
}

}  // namespace gradlane::daemon
