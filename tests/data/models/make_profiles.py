#!/usr/bin/python3
"""Generate the model profiles in tests/data/models/ (format: docs/design.md §5).

    /usr/bin/python3 tests/data/models/make_profiles.py            # all models, writes JSON here
    /usr/bin/python3 tests/data/models/make_profiles.py resnet18   # just one
    /usr/bin/python3 tests/data/models/make_profiles.py --out /tmp/p regnet_y_400mf
        # another torchvision classification model (torchvision.models.list_models(); not
        # inception_v3, whose training forward returns its auxiliary output too), written to
        # /tmp/p: how docs/simulator.md checks the policy on models we did not develop with

Needs Debian's python3-torch / python3-torchvision and libopenblas0-openmp
(`deploy/install-deps.sh --profiles`); without an optimised BLAS linear layers run ~30x too
slow relative to convolutions and the per-layer shares are wrong. Random initialisation, no
weights or data are downloaded. Takes a few minutes on 2 cores.

What is measured (per model, on this CPU, torch.set_num_threads(1), train mode):
  * One entry per parameterised module (a module that itself owns parameters: conv, bn,
    linear, layernorm, embedding), weight+bias merged, in the order the forward pass calls
    them. param_bytes = fp32 bytes of the module's own parameters (buffers such as BN running
    stats are not gradients and are left out).
  * Forward: a forward pre-hook stamps when each layer starts. fwd_us[i] = start[i+1] -
    start[i] (last layer: until the loss is computed), so the parameter-free work that follows
    a layer (ReLU, pooling, residual add, attention softmax, ...) is charged to that layer and
    sum(fwd_us) is the whole forward pass.
  * Backward: a gradient hook on every parameter stamps when its gradient is produced; a
    layer is ready when all its parameters' gradients are. ready[i] is measured from the call
    of loss.backward(). bwd_us[last] = ready[last], bwd_us[i] = ready[i] - ready[i+1], so
    sum(bwd_us) is the whole backward pass up to the first layer's gradient and ready_us is
    exactly the cumulative bwd_us from the last layer down (the design's default).
  * WARMUP iterations are discarded, then the per-layer median over ITERS iterations is taken
    (fwd deltas and ready times separately; the element-wise median of non-increasing ready
    vectors is itself non-increasing).
All models are profiled at a smaller batch than 32 (REFERENCES) to keep the run short; per-layer
CPU time is close to linear in the batch for these shapes, and the *shares* are what we keep.
Other jobs may share the CPU: timestamps are the profiling thread's CPU time
(time.thread_time_ns), not wall time, so preemption does not leak into the shares.

Scaling: each profile is multiplied by one factor so that sum(fwd_us)+sum(bwd_us) equals a GPU
training iteration time at batch 32 (see REFERENCES / TF_BENCH for the figures and sources;
two are published numbers, two are estimates derived from them by multiply-accumulate count,
and each file's "reference" says which). Only the total comes from the GPU figure; the split
between layers and between forward and backward is the CPU measurement.

Stepwise variants (<model>-stepwise.json): on a CPU gradients become ready in strict reverse
order, one layer after another. GPU frameworks release them in steps (Prophet, ICPP'21,
Fig. 4: MXNet ResNet-50 in blocks of ~10-13 gradients; TF VGG-19 in 4 blocks). Rule used
here: K = max(2, round(sqrt(n_layers))) blocks (ResNet-50: 107 layers -> 10 blocks of ~11,
VGG-16: 16 layers -> 4 blocks, close to Prophet's observations). The backward time T (= ready
time of layer 0) is cut into K equal slices; a layer whose strict ready time r falls into slice
b = ceil(K*r/T) is released at the end of its block, i.e. at the largest strict ready time of
any layer in the same slice. So nothing is released before it was computed, layer 0 keeps time
T, bwd_us is unchanged, and an empty slice (one layer longer than T/K) just means one block
fewer.
"""
import json
import math
import os
import statistics
import sys
import threading
import time

# glibc malloc: without these, every large autograd buffer is mmap'ed/unmapped and the
# page faults inflate backward 3-5x (docs/design.md §6). Must be set before the process starts.
_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
if any(os.environ.get(k) != v for k, v in _ENV.items()):
    os.environ.update(_ENV)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN_THREAD = threading.get_ident()
# Timestamps are this thread's CPU time, not wall time: with one intra-op thread, forward,
# backward (CPU autograd runs in the calling thread) and the hooks all run here, so time the
# scheduler gives to other processes on a busy machine is not counted.
clock = time.thread_time_ns
BATCH = 32
WARMUP = 2
ITERS = 5

# Reference GPU iteration times, all from one source: the TensorFlow benchmark tables
# (tf_cnn_benchmarks, 1x Tesla P100 in a DGX-1, fp32, batch 32 per GPU, synthetic data, SGD,
# May 2017; tensorflow.org/guide/performance/benchmarks, "Details for NVIDIA DGX-1 (NVIDIA
# Tesla P100)" -> "Other Results", also github.com/tensorflow/docs
# site/en/r1/guide/performance/benchmarks.md). It lists ResNet-50 195 img/s and VGG16 144
# img/s at batch 32. ResNet-18 and BERT-base are not in it: their time is the ResNet-50 time
# scaled by their multiply-accumulate count (counted by this script, see count_macs), i.e.
# assuming the same achieved FLOP/s as ResNet-50 on that GPU -- an estimate, said so in the file.
TF_BENCH = ("Tesla P100 (TensorFlow tf_cnn_benchmarks table, DGX-1, fp32, batch 32, synthetic "
            "data, May 2017: tensorflow.org/guide/performance/benchmarks, 'Other Results')")
REFERENCES = {
    # model: published img/s at batch 32 (None = derive from resnet50 by MACs), CPU profiling
    # batch, expected parameter count (torchvision docs / BERT-base with pooler)
    "resnet18": dict(img_s=None, profile_batch=16, expect_params=11_689_512),
    "resnet50": dict(img_s=195.0, profile_batch=8, expect_params=25_557_032),
    "vgg16": dict(img_s=144.0, profile_batch=4, expect_params=138_357_544),
    "bert-base": dict(img_s=None, profile_batch=4, expect_params=109_482_240),
    # Further architectures (issue #12: does the scheduling gain hold beyond the four above?).
    # None has a figure in TF_BENCH's table, so each time is the MAC-scaled estimate. Many small
    # tensors: densenet121, mobilenet_v2/v3, shufflenet, efficientnet, googlenet, resnet152;
    # few big ones: vgg19, alexnet, squeezenet (few and small); a second transformer: vit_b_16.
    "densenet121": dict(img_s=None, profile_batch=4, expect_params=7_978_856),
    "mobilenet_v2": dict(img_s=None, profile_batch=8, expect_params=3_504_872),
    "mobilenet_v3_large": dict(img_s=None, profile_batch=8, expect_params=5_483_032),
    "shufflenet_v2_x1_0": dict(img_s=None, profile_batch=8, expect_params=2_278_604),
    "efficientnet_b0": dict(img_s=None, profile_batch=4, expect_params=5_288_548),
    "googlenet": dict(img_s=None, profile_batch=4, expect_params=6_624_904),
    "resnet152": dict(img_s=None, profile_batch=2, expect_params=60_192_808),
    "squeezenet1_1": dict(img_s=None, profile_batch=8, expect_params=1_235_496),
    "alexnet": dict(img_s=None, profile_batch=8, expect_params=61_100_840),
    "vgg19": dict(img_s=None, profile_batch=2, expect_params=143_667_240),
    "vit_b_16": dict(img_s=None, profile_batch=1, expect_params=86_567_656),
}
ANCHOR = "resnet50"


# ---------------------------------------------------------------- BERT-base-like encoder
class BertEmbeddings(nn.Module):
    def __init__(self, vocab=30522, d=768, max_pos=512, types=2):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(max_pos, d)
        self.token_type = nn.Embedding(types, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, ids, types):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.word(ids) + self.position(pos) + self.token_type(types)
        return self.drop(self.norm(x))


class BertLayer(nn.Module):
    def __init__(self, d=768, heads=12, ffn=3072):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.attn_norm = nn.LayerNorm(d, eps=1e-12)
        self.ffn_in = nn.Linear(d, ffn)
        self.ffn_out = nn.Linear(ffn, d)
        self.ffn_norm = nn.LayerNorm(d, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads

        def split(t):
            return t.view(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = self.drop(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1))
        ctx = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.attn_norm(x + self.drop(self.attn_out(ctx)))
        y = self.ffn_out(F.gelu(self.ffn_in(x)))
        return self.ffn_norm(x + self.drop(y))


class BertBase(nn.Module):
    """BERT-base shapes (12 x 768, 12 heads, FFN 3072, vocab 30522) with pooler, no MLM head."""

    def __init__(self, layers=12):
        super().__init__()
        self.embeddings = BertEmbeddings()
        self.encoder = nn.ModuleList(BertLayer() for _ in range(layers))
        self.pooler = nn.Linear(768, 768)

    def forward(self, ids, types):
        x = self.embeddings(ids, types)
        for layer in self.encoder:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


SEQ = 128


def build(name, batch):
    """Return (model, make_inputs(), loss_fn(output))."""
    if name == "bert-base":
        model = BertBase()
        ids = torch.randint(0, 30522, (batch, SEQ))
        types = torch.zeros(batch, SEQ, dtype=torch.long)
        # Sentence-level objective on the pooled [CLS] vector; no extra parameters.
        return model, (ids, types), lambda out: out.pow(2).mean()
    # GoogLeNet without its two auxiliary classifiers: they are a training aid that inference
    # drops, and torchvision's published parameter count excludes them.
    extra = dict(aux_logits=False, init_weights=True) if name == "googlenet" else {}
    model = getattr(torchvision.models, name)(weights=None, **extra)
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 1000, (batch,))
    return model, (x,), lambda out: F.cross_entropy(out, y)


def param_layers(model, inputs):
    """The model's layers: [(name, module, [its parameters])] in named_modules order.

    A layer is a module that the forward pass calls and that owns parameters. A module whose
    parameters a parent uses without calling it (nn.MultiheadAttention's out_proj in vit_b_16,
    the qkv and proj Linears of torchvision's swin_t, whose attention is a function of their
    weights) is merged into its nearest ancestor that is called: its gradient is produced in that
    ancestor's backward, and it has no forward of its own to time."""
    called = set()
    hooks = [m.register_forward_pre_hook(lambda mod, _inp: called.add(id(mod)))
             for m in model.modules()]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    modules = dict(model.named_modules())
    params_of = {}  # id(layer module) -> its parameters, own and merged
    for n, m in model.named_modules():
        own = list(m.parameters(recurse=False))
        if not own:
            continue
        # Up the module path; it ends at the model itself (""), which the probe above called.
        host, parts = m, n.split(".") if n else []
        while id(host) not in called and parts:
            parts = parts[:-1]
            host = modules[".".join(parts)]
        params_of.setdefault(id(host), []).extend(own)
    return [(n, m, params_of[id(m)]) for n, m in model.named_modules() if id(m) in params_of]


def profile(name, batch):
    torch.manual_seed(0)
    model, inputs, loss_fn = build(name, batch)
    model.train()
    layers = param_layers(model, inputs)
    idx_of = {id(m): i for i, (_, m, _) in enumerate(layers)}
    starts, calls, ready = {}, [], {}

    def pre_hook(mod, _inp):
        i = idx_of[id(mod)]
        assert threading.get_ident() == MAIN_THREAD
        starts[i] = clock()
        calls.append(i)

    for _, m, params in layers:
        m.register_forward_pre_hook(pre_hook)
        for p in params:
            def grad_hook(g, i=idx_of[id(m)]):
                assert threading.get_ident() == MAIN_THREAD, "backward left the main thread"
                ready[i] = max(ready.get(i, 0), clock())
            p.register_hook(grad_hook)

    order = None
    fwd_runs, ready_runs, bad_order = [], [], 0
    for it in range(WARMUP + ITERS):
        for p in model.parameters():
            p.grad = None
        starts.clear(), calls.clear(), ready.clear()
        t0 = clock()
        loss = loss_fn(model(*inputs))
        t1 = clock()
        loss.backward()
        if order is None:
            order = list(calls)
            assert sorted(order) == list(range(len(layers))), "each layer must run exactly once"
        assert calls == order, "forward order changed between iterations"
        st = [starts[i] for i in order]
        fwd = [st[k + 1] - st[k] for k in range(len(st) - 1)] + [t1 - st[-1]]
        fwd[0] += st[0] - t0
        rd = [ready[i] - t1 for i in order]
        for k in range(len(rd) - 2, -1, -1):       # enforce last-layer-earliest
            if rd[k] < rd[k + 1]:
                bad_order += 1
                rd[k] = rd[k + 1]
        if it >= WARMUP:
            fwd_runs.append(fwd)
            ready_runs.append(rd)
    n = len(order)
    fwd_med = [statistics.median(r[k] for r in fwd_runs) / 1e3 for k in range(n)]
    ready_med = [statistics.median(r[k] for r in ready_runs) / 1e3 for k in range(n)]
    iter_ms = [(sum(f) + r[0]) / 1e6 for f, r in zip(fwd_runs, ready_runs)]
    names = [layers[i][0] for i in order]
    pbytes = [4 * sum(p.numel() for p in layers[i][2]) for i in order]
    return dict(names=names, param_bytes=pbytes, fwd_us=fwd_med, ready_us=ready_med,
                bad_order=bad_order, iter_ms=iter_ms,
                params=sum(p.numel() for p in model.parameters()))


def int_scale(values, factor):
    """Scale and round to integers >= 1."""
    return [max(1, round(v * factor)) for v in values]


def stepwise_ready(ready):
    n = len(ready)
    k = max(2, round(math.sqrt(n)))
    total = ready[0]
    block = [min(k, max(1, math.ceil(k * r / total))) for r in ready]
    end = {}
    for b, r in zip(block, ready):
        end[b] = max(end.get(b, 0), r)
    return [end[b] for b in block], k, len(end)


def write(path, model, batch, reference, names, pbytes, fwd, bwd, ready):
    lines = ["{", f'  "model": {json.dumps(model)},', f'  "batch_size": {batch},',
             f'  "reference": {json.dumps(reference)},', '  "layers": [']
    for k in range(len(names)):
        entry = dict(name=names[k], param_bytes=pbytes[k], fwd_us=fwd[k], bwd_us=bwd[k],
                     ready_us=ready[k])
        lines.append("    " + json.dumps(entry) + ("," if k + 1 < len(names) else ""))
    lines += ["  ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# The ATen operators that do a model's multiply-accumulates, each with a flop formula in the
# PyTorch profiler (2 flops per multiply-accumulate). Counting operators, not modules, sees the
# matmuls a model applies as functions: attention's q·kᵀ and softmax·v, and Linear weights
# applied with F.linear (swin_t's qkv and proj), which module hooks miss. Elementwise mul/add,
# which the profiler also counts, are not multiply-accumulates of a layer and are left out.
MAC_OPS = ("aten::conv2d", "aten::mm", "aten::addmm", "aten::bmm")


def count_macs(name):
    """Multiply-accumulates of one sample's forward pass, from the profiler's flop counts of
    MAC_OPS. The count before it (module hooks on Conv2d and Linear, attention matmuls added by
    hand) gave exactly the same number for every checked-in model; it missed swin_t's attention."""
    model, inputs, _ = build(name, 1)
    with torch.no_grad(), torch.profiler.profile(with_flops=True) as prof:
        model(*inputs)
    flops = sum(e.flops for e in prof.key_averages() if e.key in MAC_OPS)
    if flops <= 0:
        sys.exit(f"make_profiles: the profiler counted no flops for {name} (torch "
                 f"{torch.__version__}); its time cannot be scaled")
    return flops // 2


# A torchvision model that REFERENCES does not list: its time is MAC-scaled like the others, its
# parameter count is not checked, and it is profiled at a small batch to keep the run short.
OTHER_MODEL = dict(img_s=None, profile_batch=4, expect_params=None)


def reference_ms(name, macs):
    """(fwd+bwd ms at batch 32, text saying where it comes from)."""
    ref = REFERENCES.get(name, OTHER_MODEL)
    if ref["img_s"] is not None:
        ms = BATCH / ref["img_s"] * 1e3
        return ms, (f"{ms:.1f} ms = {BATCH} / {ref['img_s']:g} img/s, the published batch-{BATCH} "
                    f"fp32 training throughput of {name} on one {TF_BENCH}; the whole iteration "
                    f"(incl. the SGD update) is taken as fwd+bwd")
    a = REFERENCES[ANCHOR]
    a_ms = BATCH / a["img_s"] * 1e3
    ms = a_ms * macs[name] / macs[ANCHOR]
    unit = "sequence of 128 tokens" if name == "bert-base" else "image"
    return ms, (f"{ms:.1f} ms, an ESTIMATE: no published figure from the same source, so the "
                f"{ANCHOR} time there ({a_ms:.1f} ms = {BATCH} / {a['img_s']:g} img/s at batch "
                f"{BATCH}, fp32, one {TF_BENCH}) scaled by forward multiply-accumulates per "
                f"sample ({macs[name] / 1e9:.2f} G per {unit} vs {macs[ANCHOR] / 1e9:.2f} G for "
                f"{ANCHOR}, counted by the script), i.e. assuming the same achieved FLOP/s")


def check_blas():
    """Debian's reference BLAS makes linear layers ~30x too slow relative to convolutions."""
    a = torch.randn(512, 512)
    a @ a
    # CPU time of this thread, like the profile itself: on a shared machine wall time would
    # mistake other processes' load for a slow BLAS.
    t = time.thread_time()
    for _ in range(4):
        a @ a
    gflops = 4 * 2 * 512 ** 3 / (time.thread_time() - t) / 1e9
    if gflops < 10:
        sys.exit(f"matmul runs at {gflops:.1f} GFLOP/s: the reference BLAS is in use; "
                 "apt-get install libopenblas0-openmp (deploy/install-deps.sh --profiles)")


def main():
    torch.set_num_threads(1)
    check_blas()
    args = sys.argv[1:]
    out_dir = HERE
    if args[:1] == ["--out"]:
        if len(args) < 2:
            sys.exit("--out needs a directory")
        out_dir, args = args[1], args[2:]
        os.makedirs(out_dir, exist_ok=True)
    wanted = args or list(REFERENCES)
    known = set(torchvision.models.list_models(module=torchvision.models))
    for name in wanted:
        if name not in REFERENCES and name not in known:
            sys.exit(f"{name}: neither one of this script's models ({', '.join(REFERENCES)}) "
                     f"nor a torchvision classification model ({', '.join(sorted(known))})")
    macs = {n: count_macs(n) for n in set(wanted) | {ANCHOR}}
    for name in wanted:
        ref = REFERENCES.get(name, OTHER_MODEL)
        ref_ms, ref_text = reference_ms(name, macs)
        t = time.time()
        m = profile(name, ref["profile_batch"])
        n = len(m["names"])
        fwd_raw = m["fwd_us"]
        rd = m["ready_us"]
        bwd_raw = [rd[k] - (rd[k + 1] if k + 1 < n else 0) for k in range(n)]
        cpu_ms = (sum(fwd_raw) + sum(bwd_raw)) / 1e3
        factor = ref_ms * 1e3 / (sum(fwd_raw) + sum(bwd_raw))
        fwd = int_scale(fwd_raw, factor)
        bwd = int_scale(bwd_raw, factor)
        ready = [sum(bwd[k:]) for k in range(n)]
        step, k_blocks, used = stepwise_ready(ready)
        fwd_ms, bwd_ms = sum(fwd) / 1e3, sum(bwd) / 1e3
        expect = ref["expect_params"]
        ok = ("not checked" if expect is None else "OK" if m["params"] == expect
              else f"EXPECTED {expect:,}")
        print(f"{name}: {n} layers, {m['params']:,} params ({m['params'] / 1e6:.1f}M, {ok}), "
              f"{sum(m['param_bytes']) / 2**20:.1f} MiB fp32, {macs[name] / 1e9:.2f} GMAC/sample; "
              f"CPU batch {ref['profile_batch']}: median fwd+bwd {cpu_ms:.0f} ms (iters "
              f"{', '.join(f'{x:.0f}' for x in m['iter_ms'])} ms), fwd share "
              f"{sum(fwd_raw) / (sum(fwd_raw) + sum(bwd_raw)):.2f}, order fixes {m['bad_order']}; "
              f"reference {ref_ms:.1f} ms -> scaled x{factor:.4f}: fwd {fwd_ms:.1f} ms + bwd "
              f"{bwd_ms:.1f} ms = {fwd_ms + bwd_ms:.1f} ms; stepwise {used} blocks (K={k_blocks}); "
              f"{time.time() - t:.0f} s", flush=True)
        assert sum(m["param_bytes"]) == 4 * m["params"]
        what = ("BERT-base-like encoder built with torch.nn (embeddings 30522/512/2 x 768 + "
                "LayerNorm, 12 layers: separate Q/K/V/out 768x768, FFN 768-3072-768, GELU, 2 "
                "LayerNorms; pooler 768x768; seq 128)" if name == "bert-base"
                else f"torchvision {name} (224x224, 1000 classes"
                + (", no auxiliary classifiers" if name == "googlenet" else "") + ")")
        common = (
            f"{what}, random init. Layers = modules owning parameters, weight+bias merged, in "
            f"forward-call order; param_bytes = fp32 bytes ({m['params']:,} params). Times: "
            f"per-layer shares measured on a CPU (Debian python3-torch "
            f"{torch.__version__.split('a')[0]}, OpenBLAS, 1 thread, train mode) at batch "
            f"{ref['profile_batch']} (not {BATCH}, to keep the run short), medians of {ITERS} "
            f"iterations after {WARMUP} warm-up; fwd_us = from this layer's forward pre-hook to "
            f"the next layer's (parameter-free ops after a layer are charged to it); bwd_us = gap "
            f"between consecutive gradient-ready hooks, last layer first. These CPU times "
            f"({cpu_ms:.0f} ms fwd+bwd) were multiplied by one factor ({factor:.4g}) so that "
            f"sum(fwd_us)+sum(bwd_us) = {ref_text}. Result: fwd {fwd_ms:.1f} ms + bwd "
            f"{bwd_ms:.1f} ms. Only that total comes from the GPU figure; the per-layer split "
            f"and the fwd/bwd ratio are CPU shares. Made by tests/data/models/make_profiles.py.")
        write(os.path.join(out_dir, f"{name}.json"), name, BATCH,
              common + " ready_us: strict reverse order as on a CPU (= cumulative bwd_us from "
              "the last layer).",
              m["names"], m["param_bytes"], fwd, bwd, ready)
        write(os.path.join(out_dir, f"{name}-stepwise.json"), name, BATCH,
              common + f" ready_us: STEPWISE release as GPU frameworks do (Prophet, ICPP'21, "
              f"Fig. 4): the backward time T is cut into K = round(sqrt({n} layers)) = {k_blocks} "
              f"equal slices; a layer whose strict ready time r lies in slice ceil(K*r/T) is "
              f"released at the latest strict ready time in that slice ({used} non-empty "
              f"blocks); bwd_us unchanged.",
              m["names"], m["param_bytes"], fwd, bwd, step)


if __name__ == "__main__":
    main()
