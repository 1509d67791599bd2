"""gradlane — Python binding of libgradlane (ctypes over the C ABI in gradlane.h).

    import gradlane
    with gradlane.Client("/run/gradlane/gradlaned.sock") as c:
        c.register_job("job-1", rank=0, world_size=2, peers=["h0:9000", "h1:9000"],
                       policy="bytescheduler", auth_token="...")
        t = c.register_tensor("fc1.weight", nbytes=4096, dtype="f32", priority=0)
        t.buffer[:4] = b"\\0\\0\\x80?"          # a writable memoryview over shared memory
        c.post(t.id, iteration=0)
        for done in c.wait(timeout_ms=1000):
            assert done.status == gradlane.OK

Errors raise gradlane.Error (with .code, a gl_status, and the daemon's message). The library
is found through $GRADLANE_LIB, then next to this package, then the system's loader path.
A Client is not thread-safe beyond what gradlane.h allows (one poster, one poller).
"""

import ctypes
import ctypes.util
import os

__all__ = ["Client", "Tensor", "Completion", "Error", "OK", "AGAIN", "TIMEOUT", "DTYPES",
           "PRIORITY_AUTO", "WHOLE_TENSOR", "STATUS_NAMES"]

OK = 0
AGAIN = 6
TIMEOUT = 7
PRIORITY_AUTO = -1
WHOLE_TENSOR = (1 << 64) - 1
DTYPES = {"f32": 0, "float32": 0, "f16": 1, "float16": 1, "bf16": 2, "bfloat16": 2}
MODES = {"ps": 0, "allreduce": 1}  # gl_job_mode
STATUS_NAMES = {
    0: "OK", 1: "INVALID_ARGUMENT", 2: "BAD_MAGIC", 3: "BAD_VERSION", 4: "PERMISSION",
    5: "NO_MEMORY", 6: "AGAIN", 7: "TIMEOUT", 8: "DISCONNECTED", 9: "PROTOCOL",
    10: "BAD_TENSOR", 11: "BAD_RANGE", 12: "BAD_ITERATION", 13: "BAD_OPCODE",
    14: "BAD_DESCRIPTOR", 15: "NO_JOB", 16: "ALREADY_EXISTS", 17: "RING_CORRUPT", 18: "IO",
    19: "INTERNAL", 20: "BUSY", 21: "DEVICE",
}
for _code, _name in STATUS_NAMES.items():
    globals()["E_" + _name if _code else "OK"] = _code


class _ConnectOptions(ctypes.Structure):
    _fields_ = [("socket_path", ctypes.c_char_p), ("arena_bytes", ctypes.c_uint64),
                ("ring_slots", ctypes.c_uint32), ("timeout_ms", ctypes.c_int32)]


class _JobInfo(ctypes.Structure):
    _fields_ = [("job_id", ctypes.c_char_p), ("rank", ctypes.c_uint32),
                ("world_size", ctypes.c_uint32), ("peers", ctypes.POINTER(ctypes.c_char_p)),
                ("num_peers", ctypes.c_uint32), ("policy", ctypes.c_char_p),
                ("auth_token", ctypes.c_char_p)]


class _Completion(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("tensor_id", ctypes.c_uint32),
                ("iteration", ctypes.c_int64), ("offset", ctypes.c_uint64),
                ("length", ctypes.c_uint64), ("user_data", ctypes.c_uint64)]


assert ctypes.sizeof(_Completion) == 40, "gl_completion layout changed"
assert ctypes.sizeof(_ConnectOptions) == 24, "gl_connect_options layout changed"


def _load():
    candidates = []
    if os.environ.get("GRADLANE_LIB"):
        candidates.append(os.environ["GRADLANE_LIB"])
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "libgradlane.so"))
    found = ctypes.util.find_library("gradlane")
    if found:
        candidates.append(found)
    candidates.append("libgradlane.so.1")
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as e:  # try the next place
            errors.append(f"{path}: {e}")
    raise ImportError("libgradlane not found (set GRADLANE_LIB): " + "; ".join(errors))


_lib = _load()
_P = ctypes.c_void_p
_lib.gl_strerror.restype = ctypes.c_char_p
_lib.gl_strerror.argtypes = [ctypes.c_int]
_lib.gl_last_error.restype = ctypes.c_char_p
_lib.gl_last_error.argtypes = [_P]
_lib.gl_connect.argtypes = [ctypes.POINTER(_ConnectOptions), ctypes.POINTER(_P)]
_lib.gl_register_job.argtypes = [_P, ctypes.POINTER(_JobInfo)]
_lib.gl_register_job_mode.argtypes = [_P, ctypes.POINTER(_JobInfo), ctypes.c_int]
_lib.gl_register_tensor.argtypes = [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int,
                                    ctypes.c_int32, ctypes.POINTER(ctypes.c_uint32),
                                    ctypes.POINTER(_P)]
_lib.gl_register_device_tensor.argtypes = [_P, ctypes.c_char_p, _P, ctypes.c_uint64, ctypes.c_int,
                                           ctypes.c_int32, ctypes.POINTER(ctypes.c_uint32)]
_lib.gl_post.argtypes = [_P, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64,
                         ctypes.c_uint64]
_lib.gl_post_after.argtypes = [_P, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64,
                               ctypes.c_uint64, ctypes.c_uint64, _P]
_lib.gl_poll.argtypes = [_P, ctypes.POINTER(_Completion), ctypes.c_uint32,
                         ctypes.POINTER(ctypes.c_uint32)]
_lib.gl_wait.argtypes = [_P, ctypes.POINTER(_Completion), ctypes.c_uint32,
                         ctypes.POINTER(ctypes.c_uint32), ctypes.c_int]
_lib.gl_session_id.restype = ctypes.c_uint64
_lib.gl_session_id.argtypes = [_P]
_lib.gl_close.restype = None
_lib.gl_close.argtypes = [_P]
for _f in (_lib.gl_connect, _lib.gl_register_job, _lib.gl_register_job_mode,
           _lib.gl_register_tensor, _lib.gl_register_device_tensor, _lib.gl_post,
           _lib.gl_post_after, _lib.gl_poll, _lib.gl_wait):
    _f.restype = ctypes.c_int


def strerror(code):
    return _lib.gl_strerror(code).decode()


class Error(Exception):
    """A libgradlane call failed: .code is the gl_status, .detail the daemon's message."""

    def __init__(self, code, detail=""):
        self.code = code
        self.name = STATUS_NAMES.get(code, str(code))
        self.detail = detail
        super().__init__(f"{self.name}: {strerror(code)}" + (f" ({detail})" if detail else ""))


class Completion:
    __slots__ = ("status", "tensor_id", "iteration", "offset", "length", "user_data")

    def __init__(self, c):
        self.status, self.tensor_id, self.iteration = c.status, c.tensor_id, c.iteration
        self.offset, self.length, self.user_data = c.offset, c.length, c.user_data

    @property
    def ok(self):
        return self.status == OK

    def __repr__(self):
        return (f"Completion({STATUS_NAMES.get(self.status, self.status)}, tensor={self.tensor_id},"
                f" iteration={self.iteration}, range=[{self.offset}, +{self.length}),"
                f" user_data={self.user_data})")


class Tensor:
    """A registered tensor: .id, .nbytes and .buffer, a writable memoryview of its bytes in
    the shared arena (valid until the client is closed)."""

    def __init__(self, tid, address, nbytes):
        self.id = tid
        self.nbytes = nbytes
        self.address = address
        self.buffer = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


class DeviceTensor:
    """A tensor in GPU memory (Client.register_device_tensor): .id, .nbytes and .device_ptr.
    Results land back in that device memory (docs/gpu.md)."""

    def __init__(self, tid, device_ptr, nbytes):
        self.id = tid
        self.nbytes = nbytes
        self.device_ptr = device_ptr


class Client:
    def __init__(self, socket_path=None, arena_bytes=0, ring_slots=0, timeout_ms=0):
        opts = _ConnectOptions(socket_path.encode() if socket_path else None, arena_bytes,
                               ring_slots, timeout_ms)
        handle = _P()
        rc = _lib.gl_connect(ctypes.byref(opts), ctypes.byref(handle))
        if rc != OK:
            raise Error(rc, _lib.gl_last_error(None).decode())
        self._c = handle
        self._tensors = []
        self._buf = (_Completion * 256)()

    def _check(self, rc):
        if rc != OK:
            raise Error(rc, _lib.gl_last_error(self._c).decode())

    @property
    def session_id(self):
        return _lib.gl_session_id(self._c)

    def register_job(self, job_id, rank, world_size, peers=(), policy=None, auth_token=None,
                     mode="ps"):
        """mode: "ps" (parameter servers, the default) or "allreduce" (ring all-reduce)."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {sorted(MODES)}")
        arr = (ctypes.c_char_p * max(len(peers), 1))(*[p.encode() for p in peers])
        info = _JobInfo(job_id.encode(), rank, world_size, arr if peers else None, len(peers),
                        policy.encode() if policy else None,
                        auth_token.encode() if auth_token else None)
        self._check(_lib.gl_register_job_mode(self._c, ctypes.byref(info), MODES[mode]))

    def register_tensor(self, name, nbytes, dtype="f32", priority=PRIORITY_AUTO):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        tid = ctypes.c_uint32()
        addr = _P()
        self._check(_lib.gl_register_tensor(self._c, name.encode(), nbytes, DTYPES[dtype],
                                            priority, ctypes.byref(tid), ctypes.byref(addr)))
        t = Tensor(tid.value, addr.value, nbytes)
        self._tensors.append(t)
        return t

    def register_device_tensor(self, name, device_ptr, nbytes, dtype="f32",
                               priority=PRIORITY_AUTO):
        """Registers `nbytes` of GPU memory at the integer device pointer `device_ptr` (e.g. a
        CUDA tensor's data_ptr(); it must stay allocated until close). Posted like any tensor;
        a completion is returned once the result is back in that device memory."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        tid = ctypes.c_uint32()
        self._check(_lib.gl_register_device_tensor(self._c, name.encode(), _P(device_ptr),
                                                   nbytes, DTYPES[dtype], priority,
                                                   ctypes.byref(tid)))
        return DeviceTensor(tid.value, device_ptr, nbytes)

    def post(self, tensor_id, iteration, offset=0, length=WHOLE_TENSOR, user_data=0,
             after_event=None):
        """Posts a ready range. Returns False if the submission ring is full (poll, retry).
        after_event: a CUDA event handle (an int, e.g. torch.cuda.Event().cuda_event) recorded
        after the range was computed; the post then waits for it alone (gl_post_after). Blocks
        until the bytes are in shared memory (the GIL is released meanwhile)."""
        if after_event:
            rc = _lib.gl_post_after(self._c, tensor_id, iteration, offset, length, user_data,
                                    _P(after_event))
        else:
            rc = _lib.gl_post(self._c, tensor_id, iteration, offset, length, user_data)
        if rc == AGAIN:
            return False
        self._check(rc)
        return True

    def poll(self, max_completions=256):
        n = ctypes.c_uint32()
        self._check(_lib.gl_poll(self._c, self._buf, min(max_completions, 256), ctypes.byref(n)))
        return [Completion(self._buf[i]) for i in range(n.value)]

    def wait(self, timeout_ms=-1, max_completions=256):
        """Completions, waiting up to timeout_ms for the first; [] on timeout."""
        n = ctypes.c_uint32()
        rc = _lib.gl_wait(self._c, self._buf, min(max_completions, 256), ctypes.byref(n),
                          timeout_ms)
        if rc == TIMEOUT:
            return []
        self._check(rc)
        return [Completion(self._buf[i]) for i in range(n.value)]

    def close(self):
        if self._c:
            for t in self._tensors:
                t.buffer.release()
            _lib.gl_close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass
