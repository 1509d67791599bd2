#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into tests/fuzz/corpus/<target>/ (checked in; rerun
after a wire or ABI change). Seeds are the valid inputs the unit tests use, so the fuzzer starts
past the first checks; model profiles (tests/data/models) and the daemon's flagfile
(deploy/gradlaned.conf) are used in place by run.sh, not copied. Inputs that once crashed a
target are kept next to these as crash-<name> files (written by hand, never by this script)."""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- admin_request: daemon/admin_request.h
for i, line in enumerate([
        {"cmd": "status"}, {"cmd": "jobs"}, {"cmd": "peers"}, {"cmd": "queues"},
        {"cmd": "bandwidth"},
        {"cmd": "trace", "job": "ctl", "iterations": 3, "timeout_s": 60, "max_spans": 100000},
        {"cmd": "trace", "job": "j", "iterations": 2.0, "timeout_s": 0.5}]):
    put("admin_request", f"{i}", json.dumps(line) + "\n")

# ---- dag: docs/dag-format.md's example and a chain
DAG = {
    "tensors": [{"name": "conv1.w", "bytes": 37632, "id": 0}, {"name": "fc.w", "bytes": 8192000, "id": 1}],
    "ops": [
        {"name": "recv.conv1", "kind": "recv", "tensor": "conv1.w"},
        {"name": "recv.fc", "kind": "recv", "tensor": "fc.w"},
        {"name": "conv1", "kind": "compute", "duration_us": 410, "deps": ["recv.conv1"]},
        {"name": "fc", "kind": "compute", "duration_us": 95.5, "deps": ["conv1", "recv.fc"]},
        {"name": "loss", "kind": "compute", "duration_us": 12, "deps": ["fc"]},
        {"name": "grad.fc", "kind": "compute", "duration_us": 190, "deps": ["loss"]},
        {"name": "grad.conv1", "kind": "compute", "duration_us": 820, "deps": ["grad.fc"]},
        {"name": "send.fc", "kind": "send", "tensor": "fc.w", "deps": ["grad.fc"]},
        {"name": "send.conv1", "kind": "send", "tensor": "conv1.w", "deps": ["grad.conv1"]}]}
put("dag", "example", json.dumps(DAG, indent=1))
put("dag", "tiny", json.dumps({"tensors": [{"name": "t", "bytes": 8}],
                               "ops": [{"name": "r", "kind": "recv", "tensor": "t"},
                                       {"name": "c", "kind": "compute", "duration_us": 1, "deps": ["r"]},
                                       {"name": "s", "kind": "send", "tensor": "t", "deps": ["c"]}]}))

# ---- wire: transport/wire.h frames (little-endian, 64-byte header)
MAGIC, VERSION = 0x464E4C47, 4


def frame(ftype, payload=b"", flags=0, job=7, key=0, it=0, off=0, length=0, prio=0, rank=1,
          dtype=0, direction=0, seq=0, payload_bytes=None):
    pb = len(payload) if payload_bytes is None else payload_bytes
    return struct.pack("<IBBHQQqQQIiHBBI", MAGIC, VERSION, ftype, flags, job, key, it, off, length,
                       pb, prio, rank, dtype, direction, seq) + payload


hello_body = struct.pack("<HHHH64sQ", 1, 2, 3, 0, b"tok", 0)
err_body = struct.pack("<II", 8, 6) + b"reason"
put("wire", "hello", b"\x14" + frame(1, hello_body))
put("wire", "hello-ok", b"\x14" + frame(2))
put("wire", "reject", b"\x14" + frame(3, err_body))
put("wire", "data-ack", b"\x14" + frame(4, b"abcdefgh", length=8, off=64, dtype=1, seq=5) +
    frame(5, length=8, off=64, seq=5) + frame(5, flags=1, length=8, seq=6))
put("wire", "data-schedule", b"\x14" + frame(4, b"abcd", flags=0x9300, length=4, seq=1))
# GPUDirect (version 4): a push asking for its result by rendezvous, and a flagged pull.
put("wire", "data-gpudirect", b"\x14" + frame(4, b"abcd", flags=0x9302, length=4, seq=1) +
    frame(4, b"efgh", flags=0x0004, length=4, off=4, seq=2))
put("wire", "goodbye", b"\x14" + frame(6, struct.pack("<II", 12, 3) + b"bye"))

# ---- reliable: mode byte + records (tests/fuzz/reliable_fuzz.cc)
DGRAM_MAGIC = 0x44524C47


def dgram(dtype, body=b"", flags=0, dst=0, src=77, seq=0, ack=0, msg_ack=0, credit=64,
          msg_offset=0, msg=0):
    return struct.pack("<IBBHIIQQQ4Q4QIIQII", DGRAM_MAGIC, 1, dtype, flags, dst, src, seq, ack,
                       msg_ack, 0, 0, 0, 0, 0, 0, 0, 0, credit, msg_offset, msg, len(body), 0) + body


def rec_dgram(d):
    return b"\x00" + struct.pack("<H", len(d)) + d


def rec_time(dt):
    return b"\x01" + bytes([dt])


def rec_send(n):
    return b"\x02" + struct.pack("<H", n)


data_fh = frame(4, b"", length=100, payload_bytes=100, seq=0)
one_packet = dgram(4, data_fh + b"x" * 100, flags=3 | 4, seq=0, msg=0)
first = dgram(4, frame(4, b"", length=300, payload_bytes=300) + b"a" * 200, flags=1, seq=0, msg=0)
last = dgram(4, b"b" * 100, flags=2, seq=1, msg=0, msg_offset=200)
ack = dgram(5)  # a pure ack: nothing of ours to acknowledge, credit 64
ack_ours = dgram(5, ack=1, msg_ack=0)  # acknowledges our first packet
close = dgram(6, frame(6, err_body))
# mode 1|4: a peer said hello, headers patched to reach its connection
put("reliable", "inbound-data", bytes([1 | 4]) + rec_dgram(one_packet) + rec_time(2) +
    rec_dgram(ack) + rec_time(200) + rec_dgram(close))
put("reliable", "inbound-two-packets", bytes([1 | 4 | 8]) + rec_dgram(last) + rec_dgram(first) +
    rec_time(1) + rec_send(500) + rec_time(3) + rec_dgram(ack) + rec_time(250))
put("reliable", "inbound-send", bytes([1 | 4]) + rec_send(3000) + rec_time(1) + rec_dgram(ack_ours) +
    rec_time(10) + rec_send(10) + rec_time(255) + rec_time(255))
# mode 2|4: we dialed; the peer answers hello-ok (or rejects)
put("reliable", "outbound-ok", bytes([2 | 4]) + rec_send(700) + rec_dgram(dgram(2, frame(2, rank=1))) +
    rec_time(1) + rec_dgram(ack) + rec_time(100))
put("reliable", "outbound-reject", bytes([2 | 4]) + rec_dgram(dgram(3, frame(3, err_body))))
# mode 0: unpatched; a raw hello from a stranger
hello = dgram(1, frame(1, hello_body, rank=1))
put("reliable", "hello-raw", bytes([0]) + rec_dgram(hello) + rec_time(1) + rec_dgram(hello))

# ---- session: mode byte + records (tests/fuzz/session_fuzz.cc), shm/abi.h layouts


def msg_header(mtype, length, req=1):
    return struct.pack("<IIQ", mtype, length, req)


def register_job(job=b"job", rank=0, world=2, policy=b"fifo", token=b"tok", peers=(b"10.0.0.1:7610", b"10.0.0.2:7610"), mode=0):
    tail = b"".join(p + b"\0" for p in peers)
    body = struct.pack("<64sII32s128sIIII", job, rank, world, policy, token, len(peers), len(tail), mode, 0) + tail
    return msg_header(3, 16 + len(body)) + body


def register_tensor(name=b"w", nbytes=4096, prio=-1, dtype=0):
    body = struct.pack("<128sQiB3s", name, nbytes, prio, dtype, b"\0\0\0")
    return msg_header(4, 16 + len(body), 2) + body


def sqe(it=0, off=0, length=1024, tensor=0, op=1, seq=0, user=9):
    return struct.pack("<QQqQQIHH2Q", seq, user, it, off, length, tensor, op, 0, 0, 0)


def rec_ctl(m):
    return b"\x00" + struct.pack("<H", len(m)) + m


put("session", "register-and-post", bytes([1 | 2]) + rec_ctl(register_job()) + rec_ctl(register_tensor()) +
    rec_ctl(register_tensor(b"b", 64, 3, 1)) + b"\x02" + sqe() + b"\x02" + sqe(off=1024, length=3072) +
    b"\x04" + b"\x01" + sqe(it=1, length=4096) + b"\x02" + sqe(tensor=1, length=64))
put("session", "ring-scribble", bytes([1 | 2]) + rec_ctl(register_job(peers=())) + rec_ctl(register_tensor()) +
    b"\x02" + sqe() + b"\x03\x00" + struct.pack("<Q", 5) + b"\x03\x02" + struct.pack("<Q", 1))
put("session", "allreduce-job", bytes([1 | 2]) + rec_ctl(register_job(mode=1)) + rec_ctl(register_tensor()) + b"\x02" + sqe())
hello_msg = msg_header(1, 48, 3) + struct.pack("<IIiIQQ", 0x4E414C47, 1, 1234, 100, 1 << 20, 0)
put("session", "hello", bytes([0x30]) + b"\x05" + struct.pack("<H", len(hello_msg)) + hello_msg)
put("session", "hello-after-hello", bytes([1]) + rec_ctl(msg_header(1, 48) + b"\0" * 32))

# ---- flags: name=value lines (daemon/config.h); deploy/gradlaned.conf is used in place
put("flags", "dpdk", "transport=dpdk\ndpdk_vdev=net_af_packet0,iface=eth0\ndpdk_window=64\n"
    "dpdk_drop_probability=0.01\ndpdk_static_arp=10.0.0.2=02:00:00:00:00:02\nlisten=10.0.0.1:7610\n")
put("flags", "limits", "allowed_uids=1000, 1001\nallowed_gids=2000\narena_bytes=1048576\n"
    "max_arena_bytes=2097152\npeer_timeout=250ms\nconnect_timeout=1m\nreduce=mean\n"
    "default_policy=p3\npartition_bytes=4096\nlisten=[::1]:0\n")
print(f"wrote seeds under {OUT}", file=sys.stderr)
