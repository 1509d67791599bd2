"""Python binding test: `import gradlane` (ctypes) against a loopback session server.
Run by meson: python_test.py SERVER_EXE (PYTHONPATH and GRADLANE_LIB set by meson)."""
import ctypes
import os
import subprocess
import sys
import tempfile

import gradlane


def main():
    server_exe = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="gradlane-py-")
    sock = os.path.join(tmp, "gradlaned.sock")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)  # the server links its sanitizer runtimes itself
    if "GRADLANE_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["GRADLANE_CHILD_ASAN_OPTIONS"]
    server = subprocess.Popen([server_exe, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    try:
        assert server.stdout.readline().strip() == b"ready", "server did not start"
        run(sock)
    finally:
        server.stdin.close()
        server.wait(timeout=10)
        os.rmdir(tmp)
    assert server.returncode == 0, server.returncode
    print("python binding: ok")


def expect_error(code, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except gradlane.Error as e:
        assert e.code == code, (e.code, str(e))
        return e
    raise AssertionError(f"expected error {code}")


def run(sock):
    e = expect_error(gradlane.E_DISCONNECTED, gradlane.Client, sock + ".missing")
    assert "cannot reach" in str(e), str(e)

    with gradlane.Client(sock, arena_bytes=1 << 20, ring_slots=64) as c:
        assert c.session_id > 0
        e = expect_error(gradlane.E_INVALID_ARGUMENT, c.register_job, "job", 3, 2)
        assert "rank 3" in str(e), str(e)
        try:
            c.register_job("job-py", 0, 2, mode="ring")
            raise AssertionError("an unknown mode must be refused")
        except ValueError as e:
            assert "allreduce" in str(e), str(e)
        c.register_job("job-py", rank=0, world_size=2, peers=["h0:9000", "h1:9000"],
                       policy="prophet", auth_token="tok")
        t = c.register_tensor("layer0.weight", nbytes=4096, dtype="bf16", priority=0)
        u = c.register_tensor("layer1.weight", nbytes=1024, dtype="f32")
        assert (t.id, u.id) == (0, 1)
        assert t.address % 64 == 0
        t.buffer[:5] = b"hello"
        assert bytes(t.buffer[:5]) == b"hello"
        expect_error(gradlane.E_ALREADY_EXISTS, c.register_tensor, "layer0.weight", 8)
        # The mode is per job: a job may be registered once per session, in either mode.
        e = expect_error(gradlane.E_ALREADY_EXISTS, c.register_job, "job-py2", 0, 1,
                         mode="allreduce")

        assert c.post(t.id, iteration=0, user_data=1)
        assert c.post(u.id, iteration=0, offset=512, length=256, user_data=2)
        assert c.post(u.id, iteration=0, offset=2, length=4, user_data=3)  # not whole f32
        assert c.post(7, iteration=0, user_data=4)  # unknown tensor
        got = []
        while len(got) < 4:
            got += c.wait(timeout_ms=2000)
        by = {d.user_data: d for d in got}
        assert by[1].ok and by[1].length == 4096 and by[1].tensor_id == 0, by[1]
        assert by[2].ok and (by[2].offset, by[2].length) == (512, 256), by[2]
        assert by[3].status == gradlane.E_BAD_RANGE, by[3]
        assert by[4].status == gradlane.E_BAD_TENSOR, by[4]
        assert c.wait(timeout_ms=20) == []  # nothing more: a timeout, not an error

        # Backpressure: without polling, posts eventually return False.
        posted = 0
        for i in range(10_000):
            if not c.post(t.id, iteration=1 + i, user_data=100 + i):  # one post per iteration
                break
            posted += 1
        assert 0 < posted < 10_000, posted
        drained = 0
        while drained < posted:
            drained += len(c.wait(timeout_ms=2000))
        assert drained == posted

    run_device(sock)

    # An all-reduce job registers in its own session.
    with gradlane.Client(sock, arena_bytes=1 << 20, ring_slots=64) as c2:
        c2.register_job("job-py-ar", rank=0, world_size=1, mode="allreduce")


def run_device(sock):
    """A tensor in GPU memory, on the in-memory CUDA driver meson names in GRADLANE_CUDA_LIBRARY
    (tests/fakes/fake_cuda.cc): the server completes ranges as they are, so what comes back to
    device memory must be what was posted, though the device copy was wiped meanwhile."""
    lib = os.environ.get("GRADLANE_CUDA_LIBRARY")
    assert lib, "the meson test sets GRADLANE_CUDA_LIBRARY to the fake CUDA driver"
    cuda = ctypes.CDLL(lib)
    assert cuda.cuInit(0) == 0
    n = 8192
    dptr = ctypes.c_ulonglong()
    assert cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(n)) == 0
    grad = bytes((i * 13 + 5) % 256 for i in range(n))
    assert cuda.cuMemcpyHtoD_v2(dptr, grad, ctypes.c_size_t(n)) == 0
    with gradlane.Client(sock, arena_bytes=1 << 20, ring_slots=16) as c:
        c.register_job("job-py-gpu", rank=0, world_size=2, peers=["h0:9000", "h1:9000"])
        host = ctypes.create_string_buffer(n)
        e = expect_error(gradlane.E_INVALID_ARGUMENT, c.register_device_tensor, "h",
                         ctypes.addressof(host), n)
        assert "not memory CUDA knows" in str(e), str(e)
        t = c.register_device_tensor("gpu.weight", dptr.value, n, dtype="f16", priority=0)
        assert t.device_ptr == dptr.value and t.nbytes == n
        assert c.post(t.id, iteration=0, user_data=7)
        assert cuda.cuMemcpyHtoD_v2(dptr, bytes(n), ctypes.c_size_t(n)) == 0  # wipe it
        assert cuda.cuCtxSynchronize() == 0  # before the copy back may land, as a real program
        got = []
        while not got:
            got = c.wait(timeout_ms=2000)
        assert got[0].ok and got[0].user_data == 7, got[0]
        back = ctypes.create_string_buffer(n)
        assert cuda.cuMemcpyDtoH_v2(back, dptr, ctypes.c_size_t(n)) == 0
        assert back.raw == grad, "the result did not come back to device memory"
    assert cuda.cuMemFree_v2(dptr) == 0


if __name__ == "__main__":
    main()
