#!/usr/bin/env python3
"""tests/bench/replay_sample.py — samples the TCP queues of run-replay's hosts while a run goes.

    replay_sample.py PERIOD_S OUT NETNS...

Every PERIOD_S seconds, for each host's network namespace, sums `ss -tn`'s Send-Q and Recv-Q
over its TCP sockets (the daemons' peer connections: nothing else talks TCP there during a run)
and appends "monotonic_ns host send_q recv_q" to OUT, until SIGTERM. Send-Q is what a daemon
has handed to the kernel and the peer has not acknowledged yet (in the socket, in tbf's queue
or on the wire): bytes the scheduler can no longer reorder. Recv-Q is what arrived and the
receiving daemon has not read yet: a daemon that falls behind shows here.
"""
import signal
import subprocess
import sys
import time


def main():
    period = float(sys.argv[1])
    out = open(sys.argv[2], "w", buffering=1)
    namespaces = sys.argv[3:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        t = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for i, ns in enumerate(namespaces):
            try:
                p = subprocess.run(["nsenter", "--net=/run/netns/" + ns, "ss", "-tnH"],
                                   capture_output=True, text=True, timeout=5)
            except (OSError, subprocess.SubprocessError):
                continue
            send_q = recv_q = 0
            for line in p.stdout.splitlines():
                f = line.split()
                if len(f) >= 3 and f[1].isdigit() and f[2].isdigit():
                    recv_q += int(f[1])
                    send_q += int(f[2])
            out.write("%d %d %d %d\n" % (t, i, send_q, recv_q))
        time.sleep(max(0.0, period - (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t) / 1e9))


if __name__ == "__main__":
    main()
