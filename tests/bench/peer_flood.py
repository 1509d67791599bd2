#!/usr/bin/env python3
"""Peer-port flood: what a daemon's memory does while strangers hold connections, and after.

    tests/bench/peer_flood.py PORT PID [CONNECTIONS=1000] [ROUNDS=3]

Opens CONNECTIONS TCP connections to gradlaned's peer port on 127.0.0.1 (each sends a partial
frame header and never a hello), holds them for a second, closes them, and prints the daemon's
VmRSS before, during and after each round. Loopback only; bounded by ROUNDS.
"""
import socket
import sys
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return -1


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    print(f"before        VmRSS {rss_kb(pid)} kB")
    for r in range(rounds):
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.send(b"\x00" * 16)
            socks.append(s)
        time.sleep(1.0)
        print(f"round {r} held  VmRSS {rss_kb(pid)} kB ({n} connections)")
        for s in socks:
            s.close()
        time.sleep(1.5)
        print(f"round {r} after VmRSS {rss_kb(pid)} kB")


if __name__ == "__main__":
    main()
