"""gradlane.torch — data-parallel PyTorch training over the host's gradlane daemon.

    import gradlane.torch as gltorch
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = gltorch.distribute(model, optimizer)     # job, rank, peers from the environment
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()          # each gradient is posted to the daemon as soon as it is ready
        optimizer.step()         # ends the iteration; the updates happen as results return
    trainer.synchronize()        # before evaluation, checkpoints, or changing the optimizer

What it does (docs/training.md has the walk and the figures):
- Every parameter's .grad is a view of that parameter's slice of the daemon's shared arena, so
  autograd accumulates straight into the memory the daemon sends from (no copy).
- A post-hook on each parameter's AccumulateGrad node posts the gradient for the current
  iteration the moment backward has produced it. The nodes are kept referenced: autograd hooks
  on a node that was garbage-collected silently never fire.
- A completion thread takes each reduced gradient as it returns (the daemons sum in rank order;
  this module divides by W, as DDP averages), applies the user's optimizer to that parameter only,
  with the hyperparameters the param groups had when optimizer.step() ended that iteration (so
  LR schedulers are honoured), then zeroes the gradient.
- A forward pre-hook on every module that owns parameters waits for those parameters' updates
  only, so layer i of iteration k+1 runs as soon as layer i's update of iteration k is done.
- Priorities follow the forward order seen in the first iteration (first layer = most urgent).
  Parameters backward did not reach are posted as zeros at optimizer.step(), so no rank waits.
- Initial parameters and floating-point buffers are broadcast from rank 0 before the first
  iteration; floating-point buffers (BatchNorm's running statistics) are broadcast from rank 0
  at every training forward, as DDP does by default (broadcast_buffers=True). Integer buffers
  (num_batches_tracked) stay local: every rank counts the same forwards.

On a GPU (every parameter on one CUDA device): each .grad is device memory of the plugin's own,
registered with Client.register_device_tensor, so results land back in it (docs/gpu.md). The
AccumulateGrad hook records a CUDA event on the stream that computed the gradient and hands it
to a poster thread, which posts once that event has passed (gl_post_after): backward never
waits for a copy, and a post never waits for the rest of backward. Updates run on the
completion thread on the default stream, which the next forward uses, so they are in order.

Guarantees and rules:
- Results are bit-identical to DDP over gloo with a communication hook that sums the ranks'
  gradients in rank order and then divides by W (tests/integration/torch_exact.sh).
- Errors never hang: a daemon or peer that dies makes the next wait (a layer's forward, step,
  synchronize) raise TrainingError on every rank within the daemon's peer timeout.
- What breaks the scheme raises TrainingError instead of giving a wrong result: a second
  backward in one iteration (gradient accumulation across micro-batches, retain_graph
  re-use), AMP's GradScaler, clip_grad_norm_/clip_grad_value_ on distributed parameters
  (the gradients are in flight when they would be read), parameters added after distribute(),
  and parameter dtypes the daemon does not reduce (it reduces float32, float16, bfloat16).
- optimizer.zero_grad() and model.zero_grad() become no-ops: the completion thread zeroes each
  gradient after its update (torch 2.x's zero_grad(set_to_none=True) would otherwise detach
  the gradients from the arena).
- Threads: one training thread calls forward, backward and step; the completion thread is
  this module's. The optimizer's state is the completion thread's between synchronize() calls:
  read optimizer.state_dict() only after synchronize().
- The daemons must reduce with --reduce=sum (their default); distribute() checks it.
"""

import atexit
import ctypes
import hashlib
import os
import threading
import time

import torch

import gradlane as _gl

__all__ = ["distribute", "broadcast_module", "Trainer", "TrainingError", "synchronize"]

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_ACTIVE = []  # trainers not yet closed (for synchronize() and the clip_grad guards)


class TrainingError(RuntimeError):
    """Training over gradlane cannot go on (or was asked to do what breaks its scheme).
    .code is the gradlane status (a gradlane.E_* value) where one applies, else None."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def _env(name, default=None):
    v = os.environ.get(name)
    return v if v not in (None, "") else default


class _JobConfig:
    """Who this rank is. Arguments win; else the environment: GRADLANE_JOB, RANK (or
    GRADLANE_RANK), WORLD_SIZE (or GRADLANE_WORLD), GRADLANE_PEERS ("host:port,..." of every
    rank's daemon, in rank order), GRADLANE_POLICY, GRADLANE_SOCKET, GRADLANE_TOKEN,
    GRADLANE_MODE ("ps", the default, or "allreduce": ring all-reduce in the daemons)."""

    def __init__(self, job_id=None, rank=None, world_size=None, peers=None, policy=None,
                 socket_path=None, auth_token=None, timeout_ms=0):
        self.job_id = job_id or _env("GRADLANE_JOB")
        rank = rank if rank is not None else _env("GRADLANE_RANK", _env("RANK"))
        world = world_size if world_size is not None else _env("GRADLANE_WORLD",
                                                               _env("WORLD_SIZE"))
        if peers is None and _env("GRADLANE_PEERS"):
            peers = _env("GRADLANE_PEERS").split(",")
        missing = [n for n, v in (("job_id / GRADLANE_JOB", self.job_id),
                                  ("rank / RANK", rank), ("world_size / WORLD_SIZE", world))
                   if v is None]
        if missing:
            raise ValueError("gradlane.torch: missing " + ", ".join(missing))
        self.rank, self.world = int(rank), int(world)
        if not 0 <= self.rank < self.world:
            raise ValueError(f"gradlane.torch: rank {self.rank} outside world size {self.world}")
        self.peers = list(peers or [])
        if self.world > 1 and len(self.peers) != self.world:
            raise ValueError(f"gradlane.torch: {len(self.peers)} peer addresses for "
                             f"{self.world} ranks (GRADLANE_PEERS: one host:port per rank)")
        self.policy = policy or _env("GRADLANE_POLICY")
        self.socket_path = socket_path or _env("GRADLANE_SOCKET")
        self.auth_token = auth_token or _env("GRADLANE_TOKEN")
        self.timeout_ms = timeout_ms
        self.mode = _env("GRADLANE_MODE") or "ps"
        if self.mode not in _gl.MODES:
            raise ValueError(f"gradlane.torch: GRADLANE_MODE {self.mode!r}: expected ps or "
                             "allreduce")

    def connect(self, job_suffix, arena_bytes):
        client = _gl.Client(self.socket_path, arena_bytes=arena_bytes,
                            timeout_ms=self.timeout_ms)
        try:
            client.register_job(self.job_id + job_suffix, self.rank, self.world, self.peers,
                                self.policy, self.auth_token, mode=self.mode)
        except BaseException:
            client.close()
            raise
        return client


def _arena_tensor(handle, dtype, count):
    """A tensor over a registered buffer. Built on its own ctypes view of the address, not on
    handle.buffer, so Client.close() can release that memoryview; gl_close unmaps the memory,
    so no such tensor may be used after it (Trainer.close() gives parameters their own .grad)."""
    raw = (ctypes.c_char * handle.nbytes).from_address(handle.address)
    return torch.frombuffer(raw, dtype=dtype, count=count)


def _tensor_name(name):
    """The daemon's name for a parameter: the parameter's own, or for one longer than the
    daemon takes (127 bytes), its head and a hash of the whole (the same on every rank)."""
    raw = name.encode()
    if len(raw) < 128:
        return name
    return raw[:100].decode(errors="ignore") + "#" + hashlib.sha1(raw).hexdigest()[:16]


def _arena_bytes(tensors):
    # Each buffer is placed 64-byte aligned; the daemon also needs room for its own records.
    return sum(((t.numel() * t.element_size() + 63) // 64) * 64 for t in tensors) + (1 << 20)


def _check_dtype(what, t):
    if t.dtype not in _DTYPES:
        raise TrainingError(f"gradlane.torch: {what} has dtype {t.dtype}; the daemon reduces "
                            "float32, float16 and bfloat16 only")
    if t.device.type not in ("cpu", "cuda"):
        raise TrainingError(f"gradlane.torch: {what} is on {t.device}; this plugin trains on "
                            "CPU or CUDA tensors")


def _one_device(what, tensors):
    """The one device every tensor is on (a process drives one GPU, or the CPU)."""
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise TrainingError(f"gradlane.torch: {what} are on {', '.join(devices)}; one process "
                            "trains on one device (one GPU per rank, or the CPU)")
    return torch.device(devices[0]) if devices else torch.device("cpu")


def _float_buffers(model):
    return [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]


def _wait_all(client, count, what, timeout_s):
    """Waits for `count` completions; raises TrainingError on an error, or when timeout_s pass
    without one."""
    deadline = time.monotonic() + timeout_s
    while count > 0:
        try:
            done = client.wait(timeout_ms=500)
        except _gl.Error as e:
            raise TrainingError(f"gradlane.torch: {what}: {e}", e.code) from e
        for c in done:
            if not c.ok:
                raise TrainingError(f"gradlane.torch: {what}: "
                                    f"{_gl.STATUS_NAMES.get(c.status, c.status)}", c.status)
        count -= len(done)
        if done:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise TrainingError(f"gradlane.torch: {what}: no answer in {timeout_s:.0f} s")


def broadcast_module(model, config=None, timeout_s=600.0, **job):
    """Copies rank 0's parameters and floating-point buffers into every rank's `model`.

    A one-off job (`<job>.init`): every rank posts one tensor per dtype, rank 0 its values and
    the others -0.0, whose rank-ordered sum is rank 0's values bit for bit (x + -0.0 == x for
    every x, +0.0 included). One extra element, 1.0 from every rank, must come back as W: that
    proves the daemons sum (gradlane.torch's arithmetic needs --reduce=sum)."""
    cfg = config or _JobConfig(**job)
    tensors = [p.data for p in model.parameters()] + [b for _, b in _float_buffers(model)]
    for i, t in enumerate(tensors):
        _check_dtype(f"parameter/buffer #{i}", t)
    groups = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    groups.setdefault(torch.float32, [])
    client = cfg.connect(".init", _arena_bytes(tensors) + 4096)
    try:
        slots = []
        for dtype, ts in sorted(groups.items(), key=lambda kv: str(kv[0])):
            n = sum(t.numel() for t in ts) + (1 if dtype == torch.float32 else 0)
            h = client.register_tensor(f"init.{_DTYPES[dtype]}", n * torch.empty(
                (), dtype=dtype).element_size(), _DTYPES[dtype], priority=0)
            flat = _arena_tensor(h, dtype, n)
            slots.append((h, flat, ts, dtype))
        with torch.no_grad():
            for h, flat, ts, dtype in slots:
                off = 0
                for t in ts:
                    view = flat[off:off + t.numel()]
                    if cfg.rank == 0:
                        view.copy_(t.reshape(-1))
                    else:
                        view.fill_(-0.0)
                    off += t.numel()
                if dtype == torch.float32:
                    flat[off] = 1.0
                while not client.post(h.id, 0):
                    time.sleep(1e-4)
            _wait_all(client, len(slots), "initial broadcast", timeout_s)
            for h, flat, ts, dtype in slots:
                if dtype == torch.float32:
                    got = float(flat[-1])
                    if got != float(cfg.world):
                        raise TrainingError(
                            f"gradlane.torch: the daemons do not sum ({got} where {cfg.world} "
                            "was due): start gradlaned with --reduce=sum (its default)")
                off = 0
                for t in ts:
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()
    finally:
        slots = flat = None
        client.close()


class _Param:
    __slots__ = ("param", "name", "group", "handle", "grad", "node", "order", "posted",
                 "updated")

    def __init__(self, param, name, group):
        self.param, self.name, self.group = param, name, group
        self.handle = self.grad = self.node = None
        self.order = None
        self.posted = -1   # last iteration posted (training thread)
        self.updated = -1  # last iteration whose update is applied (completion thread)


class Trainer:
    """One rank's distributed training state; made by distribute(). Methods are for the training
    thread."""

    def __init__(self, model, optimizer, config, average=True, broadcast=True, timeout_s=600.0):
        self._model, self._opt, self._cfg = model, optimizer, config
        self._average = average
        self._timeout_s = timeout_s
        self._world = config.world
        self._lock = threading.Condition()
        self._error = None
        self._iteration = 0            # the iteration forward/backward are in now
        self._hparams = {}             # iteration -> param groups' hyperparameters at its step()
        self._pending = {}             # iteration -> parameters not yet updated
        self._buffers_done = -1        # last iteration whose buffer broadcast returned
        self._buffers_posted = -1
        self._buffer_counts = {}       # iteration -> buffer tensors returned (one per dtype)
        self._deferred = []            # (param, iteration) results waiting for their step()
        self._client = None
        self._thread = None
        self._stop = False
        self._registered = False
        self._forward_order = []
        self._hooks = []
        # Seconds each module's forward waited for its parameters' updates (module name ->
        # seconds, summed over iterations): where the schedule made compute wait.
        self.forward_stall_s = {}

        group_of = {}
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                group_of[id(p)] = gi
        self._groups = len(optimizer.param_groups)
        self._params = []
        self._by_param = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if id(p) not in group_of:
                raise TrainingError(f"gradlane.torch: parameter {name} is not in the optimizer")
            _check_dtype(f"parameter {name}", p)
            e = _Param(p, name, group_of[id(p)])
            self._params.append(e)
            self._by_param[id(p)] = e
        self._buffers = _float_buffers(model)
        for n, b in self._buffers:
            _check_dtype(f"buffer {n}", b)
        self._device = _one_device("the parameters and buffers",
                                   [e.param for e in self._params] + [b for _, b in self._buffers])
        self._cuda = self._device.type == "cuda"
        # CUDA: gradients go out from the poster thread (one at a time with the training
        # thread's posts: libgradlane takes one poster at a time).
        self._post_lock = threading.Lock()
        self._post_queue = None
        self._poster = None
        self._buffer_slots = []   # (handle, flat view, [buffers]) per dtype

        if broadcast and config.world > 1:
            broadcast_module(model, config, timeout_s)
        # The optimizer the completion thread steps: the same class, state and defaults, its
        # own param groups (narrowed to one parameter per step, given the iteration's
        # hyperparameters), so the user's groups are never touched from another thread.
        shadow = object.__new__(type(optimizer))
        shadow.__dict__.update(optimizer.__dict__)
        for attr in ("step", "zero_grad"):  # instance-level wrappers (LR schedulers add one)
            shadow.__dict__.pop(attr, None)
        shadow.param_groups = [dict(g) for g in optimizer.param_groups]
        self._shadow = shadow
        self._install()
        _ACTIVE.append(self)

    # ---- set-up --------------------------------------------------------------------------

    def _install(self):
        model, opt = self._model, self._opt
        self._hooks.append(model.register_forward_pre_hook(self._on_model_forward))
        self._hooks.append(model.register_forward_hook(self._on_model_forward_done))
        self._module_names = {id(m): n or "(model)" for n, m in model.named_modules()}
        for m in model.modules():
            own = [self._by_param[id(p)] for p in m.parameters(recurse=False)
                   if id(p) in self._by_param]
            if own:
                self._hooks.append(m.register_forward_pre_hook(self._layer_waiter(m, own)))
        self._user_step = opt.__dict__.get("step")

        def step(*args, **kwargs):
            # What an LR scheduler's own step wrapper would record (torch 1.13: _step_count and
            # _with_counter; 2.x: _opt_called and _wrapped_by_lr_sched), so schedulers made
            # before or after distribute() neither warn nor miscount.
            opt._step_count = getattr(opt, "_step_count", 0) + 1
            opt._opt_called = True
            return self._step(*args, **kwargs)
        step._with_counter = True
        step._wrapped_by_lr_sched = True
        opt.step = step
        opt.zero_grad = _no_zero_grad
        model.zero_grad = _no_zero_grad
        opt._step_supports_amp_scaling = True  # so GradScaler hands itself to step(): refused

    def _register(self):
        """End of the first training forward: the forward order is known; registers every
        gradient with its priority and points .grad at its arena slice."""
        order = {}
        for m in self._forward_order:
            for p in m.parameters(recurse=False):
                if id(p) in self._by_param and id(p) not in order:
                    order[id(p)] = len(order)
        tensors = [e.param for e in self._params] + [b for _, b in self._buffers]
        self._client = self._cfg.connect("", _arena_bytes(tensors))
        bufs = {}
        for _, b in self._buffers:
            bufs.setdefault(b.dtype, []).append(b)
        for dtype, bs in sorted(bufs.items(), key=lambda kv: str(kv[0])):
            n = sum(b.numel() for b in bs)
            h = self._client.register_tensor(f"buffers.{_DTYPES[dtype]}", n * bs[0].element_size(),
                                             _DTYPES[dtype], priority=0)
            self._buffer_slots.append((h, _arena_tensor(h, dtype, n), bs))
        unseen = len(order)
        for e in self._params:
            if id(e.param) in order:
                e.order = order[id(e.param)]
            else:
                e.order = unseen
                unseen += 1
        self._by_tid = {}
        for e in sorted(self._params, key=lambda x: x.order):
            p = e.param
            if self._cuda:
                # Device memory of our own, for the life of the trainer (the daemon's results
                # land in it); zeroed on the current stream, which every later use follows.
                e.grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
                e.handle = self._client.register_device_tensor(
                    _tensor_name(e.name), e.grad.data_ptr(), p.numel() * p.element_size(),
                    _DTYPES[p.dtype], priority=1 + e.order)
            else:
                e.handle = self._client.register_tensor(
                    _tensor_name(e.name), p.numel() * p.element_size(), _DTYPES[p.dtype],
                    priority=1 + e.order)
                e.grad = _arena_tensor(e.handle, p.dtype, p.numel()).view_as(p)
            self._by_tid[e.handle.id] = e
            with torch.no_grad():
                # A gradient left from before distribute() is dropped, as the user's
                # zero_grad() (a no-op from now on) would have dropped it.
                e.grad.zero_()
            p.grad = e.grad
            # p.expand_as(p) is a view whose grad_fn's next function is p's AccumulateGrad.
            e.node = p.expand_as(p).grad_fn.next_functions[0][0]
            e.node.register_hook(self._grad_hook(e))
        for h, _, _ in self._buffer_slots:
            self._by_tid[h.id] = None
        self._registered = True
        if self._cuda:
            import queue
            self._post_queue = queue.SimpleQueue()
            self._poster = threading.Thread(target=self._post_gradients, name="gradlane-poster",
                                            daemon=True)
            self._poster.start()
        self._thread = threading.Thread(target=self._complete, name="gradlane-completion",
                                        daemon=True)
        self._thread.start()

    # ---- hooks (training thread) -----------------------------------------------------------

    def _training_forward(self):
        return self._model.training and torch.is_grad_enabled()

    def _on_model_forward(self, module, inputs):
        self._raise_if_failed()
        k = self._iteration
        if not self._registered:
            self._forward_order = []
        elif (self._buffer_slots and self._training_forward() and
              self._buffers_posted < k <= self._buffers_posted + 1):
            # DDP's default: rank 0's buffers at the start of each training forward.
            self._wait(lambda: self._buffers_done >= k - 1, "buffer broadcast")
            self._unpack_buffers()

    def _unpack_buffers(self):
        """The last broadcast's result (rank 0's buffers) into the model's buffers."""
        with torch.no_grad():
            for _, flat, bs in self._buffer_slots:
                off = 0
                for b in bs:
                    b.copy_(flat[off:off + b.numel()].view_as(b))
                    off += b.numel()

    def _layer_waiter(self, module, own):
        name = self._module_names.get(id(module), type(module).__name__)

        def hook(m, inputs):
            if not self._registered:
                self._forward_order.append(m)
                return
            k = self._iteration
            if any(e.updated < k - 1 for e in own):
                t0 = time.perf_counter()
                self._wait(lambda: all(e.updated >= k - 1 for e in own),
                           f"update of {type(m).__name__} parameters")
                self.forward_stall_s[name] = (self.forward_stall_s.get(name, 0.0) +
                                              time.perf_counter() - t0)
            for e in own:
                if e.param.grad is not e.grad:  # set_to_none or a user assignment
                    e.param.grad = e.grad
        return hook

    def _on_model_forward_done(self, module, inputs, output):
        if not self._training_forward():
            return
        if not self._registered:
            self._register()
        k = self._iteration
        if self._buffers_posted >= k:
            return  # a second forward in the iteration: buffers went out with the first
        with torch.no_grad():
            for h, flat, bs in self._buffer_slots:
                off = 0
                for b in bs:
                    view = flat[off:off + b.numel()]
                    if self._cfg.rank == 0:
                        view.copy_(b.reshape(-1))
                    else:
                        view.fill_(-0.0)
                    off += b.numel()
                self._post(h.id, k)
        self._buffers_posted = k

    def _grad_hook(self, e):
        def hook(grad_inputs, grad_outputs):
            k = self._iteration
            if e.posted >= k:
                self._fail(TrainingError(
                    f"gradlane.torch: a second gradient for {e.name} in iteration {k}: "
                    "gradient accumulation across backward passes (micro-batches, retain_graph) "
                    "is not supported; call optimizer.step() after each backward()"))
                self._raise_if_failed()
            e.posted = k
            if self._cuda:
                # This hook runs when the accumulation is queued, not done: the event marks its
                # end on the stream that computed it, and the poster posts once it has passed.
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(e.grad.device))
                self._post_queue.put((e.handle.id, k, ready))
            else:
                self._post(e.handle.id, k)
        return hook

    def _post(self, tid, k, after=None):
        try:
            while True:
                event = None if after is None else after.cuda_event
                with self._post_lock:
                    if self._client.post(tid, k, after_event=event):
                        return
                # The ring is full: the completion thread drains it (unless closing).
                self._raise_if_failed()
                if self._stop:
                    return
                time.sleep(1e-4)
        except _gl.Error as e:  # the session ended (the daemon died or closed it)
            self._fail(TrainingError(f"gradlane.torch: rank {self._cfg.rank}: post of "
                                     f"iteration {k}: {e}", e.code))
            self._raise_if_failed()

    def _post_gradients(self):
        """The poster thread (CUDA): posts each gradient once the event recorded after its
        accumulation has passed, in the order backward produced them. None stops it."""
        while True:
            item = self._post_queue.get()
            if item is None or self._error is not None:
                return
            tid, k, ready = item
            try:
                self._post(tid, k, ready)
            except TrainingError:
                return  # _post recorded it; the training thread raises it

    # ---- step and waits (training thread) ---------------------------------------------------

    def _step(self, closure=None, **kwargs):
        if "grad_scaler" in kwargs or "found_inf" in kwargs:
            self._fail(TrainingError("gradlane.torch: AMP's GradScaler is not supported (it "
                                     "reads gradients before they are reduced)"))
        if closure is not None:
            self._fail(TrainingError("gradlane.torch: optimizer.step(closure) is not "
                                     "supported (the update happens as gradients return)"))
        self._raise_if_failed()
        if len(self._opt.param_groups) != self._groups:
            self._fail(TrainingError("gradlane.torch: param groups were added after "
                                     "distribute(); call it again on a new optimizer"))
            self._raise_if_failed()
        if not self._registered:
            raise TrainingError("gradlane.torch: optimizer.step() before any training forward")
        k = self._iteration
        with self._lock:
            self._hparams[k] = [{n: v for n, v in g.items() if n != "params"}
                                for g in self._opt.param_groups]
            self._pending[k] = len(self._params)
            self._lock.notify_all()
        for e in self._params:  # unused in this iteration: zeros, so no rank waits for them
            if e.posted < k:
                # Its buffer holds the last reduced result until that update zeroes it.
                if e.updated < k - 1:
                    self._wait(lambda: e.updated >= k - 1, f"update of {e.name}")
                e.posted = k
                self._post(e.handle.id, k)
        if self._buffer_slots and self._buffers_posted < k:
            # No training forward this iteration: keep the cadence. The slots hold the last
            # result until it has returned; only then may they be posted again.
            self._wait(lambda: self._buffers_done >= k - 1, "buffer broadcast")
            self._buffers_posted = k
            for h, flat, _ in self._buffer_slots:
                if self._cfg.rank != 0:
                    flat.fill_(-0.0)
                self._post(h.id, k)
        self._iteration = k + 1

    def _raise_if_failed(self):
        if self._error is not None:
            raise self._error

    def _fail(self, err):
        with self._lock:
            if self._error is None:
                self._error = err
            self._lock.notify_all()

    def _wait(self, predicate, what):
        deadline = time.monotonic() + self._timeout_s
        with self._lock:
            while not predicate():
                if self._error is not None:
                    raise self._error
                if time.monotonic() > deadline:
                    raise TrainingError(f"gradlane.torch: {what}: no progress in "
                                        f"{self._timeout_s:.0f} s")
                self._lock.wait(0.5)
        self._raise_if_failed()

    def synchronize(self):
        """Waits until every stepped iteration's updates and buffer broadcasts are applied:
        the parameters and the optimizer state are then the training thread's to read or
        change (evaluation, checkpoints). Raises TrainingError if training failed."""
        self._raise_if_failed()
        if not self._registered:
            return
        last = self._iteration - 1
        self._wait(lambda: all(e.updated >= last for e in self._params) and
                   (not self._buffer_slots or self._buffers_done >= last), "synchronize")
        if self._buffer_slots and last >= 0:
            self._unpack_buffers()

    @property
    def iteration(self):
        return self._iteration

    def close(self):
        """Synchronizes (if training is healthy), stops the completion thread, removes the hooks
        and gives each parameter back an ordinary .grad. Idempotent. Runs at interpreter exit
        for a Trainer still open (an exception ended the script), without synchronizing."""
        try:
            if self._error is None and self._registered and self in _ACTIVE:
                self.synchronize()
        finally:
            self._shutdown()

    def _shutdown(self):
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._stop = True
        try:
            if self._poster is not None and self._poster is not threading.current_thread():
                self._post_queue.put(None)
                self._poster.join()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()  # it waits at most 200 ms at a time
            for h in self._hooks:
                h.remove()
            self._hooks = []
            for attr in ("step", "zero_grad"):
                self._opt.__dict__.pop(attr, None)
            if self._user_step is not None:
                self._opt.step = self._user_step
            self._model.__dict__.pop("zero_grad", None)
            self._opt.__dict__.pop("_step_supports_amp_scaling", None)
            # Device gradients stay referenced until the client is closed: a copy back still
            # in flight (an error ended training) must not land in memory reused meanwhile.
            registered = []
            for e in self._params:
                if e.grad is not None and e.param.grad is e.grad:
                    e.param.grad = e.grad.clone()
                registered.append(e.grad)
                e.grad = None
                e.node = None
            self._buffer_slots = []
            if self._client is not None:
                self._client.close()
                self._client = None
            del registered
        finally:
            self._thread = None
            self._poster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the completion thread ---------------------------------------------------------------

    def _complete(self):
        try:
            while not self._stop and self._error is None:
                # A result that beat its iteration's optimizer.step() waits in _deferred; the
                # completion ring is drained meanwhile, so the daemon never waits on us.
                if self._deferred:
                    with self._lock:
                        ready = sorted(((e, k) for e, k in self._deferred if k in self._hparams),
                                       key=lambda ek: (ek[1], ek[0].order))
                        self._deferred = [(e, k) for e, k in self._deferred
                                          if k not in self._hparams]
                    for e, k in ready:
                        self._apply(e, k)
                try:
                    done = self._client.wait(timeout_ms=1 if self._deferred else 200)
                except _gl.Error as e:
                    raise TrainingError(f"gradlane.torch: rank {self._cfg.rank}: {e}",
                                        e.code) from e
                # The most urgent first: the next forward needs the first layers first, and an
                # update applied out of priority order would make the first layer wait behind
                # the optimizer work of the last.
                if len(done) > 1:
                    done.sort(key=self._urgency)
                for c in done:
                    if not c.ok:
                        detail = self._client_detail()
                        raise TrainingError(
                            f"gradlane.torch: rank {self._cfg.rank}: iteration {c.iteration} of "
                            f"job {self._cfg.job_id} failed: "
                            f"{_gl.STATUS_NAMES.get(c.status, c.status)}"
                            + (f" ({detail})" if detail else
                               " (the daemon's log names the cause, e.g. a peer that is gone)"),
                            c.status)
                    e = self._by_tid.get(c.tensor_id, False)
                    if e is False:
                        raise TrainingError(f"gradlane.torch: completion of unknown tensor "
                                            f"{c.tensor_id}")
                    if e is None:
                        self._buffer_returned(c.iteration)
                    elif c.iteration in self._hparams:
                        self._apply(e, c.iteration)
                    else:
                        with self._lock:
                            self._deferred.append((e, c.iteration))
        except TrainingError as err:
            self._fail(err)
        except BaseException as err:  # an optimizer error: the training thread re-raises it
            self._fail(TrainingError(f"gradlane.torch: update failed: {err!r}"))

    def _urgency(self, c):
        e = self._by_tid.get(c.tensor_id)
        return (c.iteration, -1 if e is None else e.order)

    def _client_detail(self):
        try:
            return _gl._lib.gl_last_error(self._client._c).decode()
        except Exception:  # the client is closing: no detail to add
            return ""

    def _buffer_returned(self, k):
        # Several dtypes are several tensors: the iteration is done when all have returned.
        with self._lock:
            n = self._buffer_counts.get(k, 0) + 1
            if n == len(self._buffer_slots):
                self._buffer_counts.pop(k, None)
                self._buffers_done = k
                self._lock.notify_all()
            else:
                self._buffer_counts[k] = n

    def _apply(self, e, k):
        with self._lock:
            hp = self._hparams[k]
        with torch.no_grad():
            if self._average:
                e.grad.div_(self._world)
            for gi, g in enumerate(self._shadow.param_groups):
                g.update(hp[gi])
                g["params"] = [e.param] if gi == e.group else []
            if e.param.grad is not e.grad:  # reset by the user: the update must still see it
                e.param.grad = e.grad
            type(self._shadow).step(self._shadow)
            e.grad.zero_()
        with self._lock:
            e.updated = k
            self._pending[k] -= 1
            if self._pending[k] == 0:
                del self._pending[k]
                del self._hparams[k]
            self._lock.notify_all()


def _no_zero_grad(*args, **kwargs):
    """gradlane.torch zeroes each gradient after its update; zeroing here would race the
    reduction in flight."""


def distribute(model, optimizer, *, job_id=None, rank=None, world_size=None, peers=None,
               policy=None, socket_path=None, auth_token=None, average=True, broadcast=True,
               timeout_s=600.0):
    """Makes `model` train data-parallel over the gradlane daemons with `optimizer`, which is
    changed in place: step() ends an iteration without blocking, zero_grad() does nothing.
    Returns the Trainer (synchronize(), close()). average=False keeps the plain sum of the W
    gradients. timeout_s bounds any one wait that sees no progress (the daemons report a dead
    peer sooner, within their --peer_timeout)."""
    cfg = _JobConfig(job_id, rank, world_size, peers, policy, socket_path, auth_token)
    return Trainer(model, optimizer, cfg, average=average, broadcast=broadcast,
                   timeout_s=timeout_s)


def synchronize():
    """synchronize() of every open Trainer in this process."""
    for t in list(_ACTIVE):
        t.synchronize()


@atexit.register
def _close_at_exit():
    # The completion thread must be stopped before the client is closed under it.
    for t in list(_ACTIVE):
        try:
            t._shutdown()
        except Exception:  # exiting anyway: the daemon reclaims the session when we are gone
            pass


def _guard_clip(fn):
    def guarded(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for t in _ACTIVE:
            if any(id(p) in t._by_param for p in params):
                err = TrainingError(f"gradlane.torch: {fn.__name__} on distributed parameters "
                                    "is not supported: their gradients are being reduced when "
                                    "it would read them")
                t._fail(err)
                raise err
        return fn(params, *args, **kwargs)
    guarded.__name__ = fn.__name__
    guarded.__doc__ = fn.__doc__
    guarded.__wrapped__ = fn
    return guarded


# Refuse clipping on distributed parameters (a wrong result otherwise); other uses unchanged.
for _name in ("clip_grad_norm_", "clip_grad_value_"):
    _orig = getattr(torch.nn.utils, _name)
    if not hasattr(_orig, "__wrapped__"):
        setattr(torch.nn.utils, _name, _guard_clip(_orig))
