"""torch_errors.py — gradlane.torch against one real daemon (W = 1): the plugin's own rules.

    torch_errors.py SOCKET

- W = 1 training through the plugin equals plain local training bit for bit (SGD + momentum,
  an LR schedule, an unused parameter posted as zeros, a frozen parameter left alone), and
  set_to_none zero_grad cannot detach the arena gradients;
- what breaks the scheme raises TrainingError: a second backward in one iteration, clipping
  distributed gradients, step(closure), a float64 parameter, a CUDA-less GradScaler-style call
  (step(grad_scaler=...)); after such an error every later call raises it again;
- synchronize() hands the optimizer back: an LR change made after it applies to the next
  iteration, and close() leaves ordinary gradients behind.
Prints one line per check; exit 0 only if all hold."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradlane.torch as gltorch

SOCKET = sys.argv[1]
_job = [0]


def job_kwargs():
    _job[0] += 1
    return dict(job_id=f"torch-errors-{_job[0]}", rank=0, world_size=1, peers=[],
                socket_path=SOCKET, timeout_s=30)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.unused = nn.Linear(3, 3)    # never called: posted as zeros at step()
        self.fc2 = nn.Linear(16, 4)
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def batches(n):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 4, (8,), generator=g))
            for _ in range(n)]


def run(distributed, iters=12, lr_change_at=None):
    torch.manual_seed(3)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    trainer = gltorch.distribute(model, opt, **job_kwargs()) if distributed else None
    losses = []
    for it, (x, y) in enumerate(batches(iters)):
        if it == lr_change_at:
            if trainer:
                trainer.synchronize()
            for g in opt.param_groups:
                g["lr"] = 0.01
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    if trainer:
        trainer.close()
        # close() gives every parameter a gradient of its own: the arena is unmapped.
        check("close() leaves no gradient in the arena",
              all(p.grad is None or p.grad._base is None for p in model.parameters()))
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def check(name, cond):
    print(("ok   " if cond else "FAIL ") + name, flush=True)
    if not cond:
        check.failed = True


check.failed = False


def expect_training_error(name, fn, needle):
    try:
        fn()
    except gltorch.TrainingError as e:
        check(f"{name}: {e}", needle in str(e))
        return
    check(f"{name}: no TrainingError raised", False)


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def main():
    ref_losses, ref_state = run(False)
    got_losses, got_state = run(True)
    check("W=1 plugin training equals local training (losses)",
          [x.hex() for x in ref_losses] == [x.hex() for x in got_losses])
    check("W=1 plugin training equals local training (parameters)", same(ref_state, got_state))
    ref_losses, ref_state = run(False, lr_change_at=6)
    got_losses, got_state = run(True, lr_change_at=6)
    check("an LR change after synchronize() applies from the next iteration",
          [x.hex() for x in ref_losses] == [x.hex() for x in got_losses] and
          same(ref_state, got_state))

    # Parameter names past the daemon's 127 bytes are shortened the same way on every rank.
    long_model = nn.Sequential()
    long_model.add_module("a" * 140, nn.Linear(12, 4))
    long_opt = torch.optim.SGD(long_model.parameters(), lr=0.1)
    trainer = gltorch.distribute(long_model, long_opt, **job_kwargs())
    before = [p.detach().clone() for p in long_model.parameters()]
    for x, y in batches(2):
        F.cross_entropy(long_model(x), y).backward()
        long_opt.step()
    trainer.close()
    check("a 140-character parameter name trains",
          all(not torch.equal(a, b) for a, b in zip(before, long_model.parameters())))

    # A second backward in one iteration (micro-batch accumulation).
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = gltorch.distribute(model, opt, **job_kwargs())
    (x, y), (x2, y2) = batches(2)

    def accumulate():
        F.cross_entropy(model(x), y).backward()
        F.cross_entropy(model(x2), y2).backward()
    expect_training_error("second backward", accumulate, "second gradient")
    expect_training_error("later calls raise it again", lambda: model(x), "second gradient")
    trainer.close()

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = gltorch.distribute(model, opt, **job_kwargs())
    F.cross_entropy(model(x), y).backward()
    expect_training_error("clip_grad_norm_",
                          lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0),
                          "clip_grad_norm_")
    trainer.close()
    other = nn.Linear(2, 2)
    other(torch.ones(1, 2)).sum().backward()
    torch.nn.utils.clip_grad_norm_(other.parameters(), 1.0)
    check("clip_grad_norm_ on other parameters still works", other.weight.grad is not None)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = gltorch.distribute(model, opt, **job_kwargs())
    F.cross_entropy(model(x), y).backward()
    expect_training_error("step(closure)", lambda: opt.step(lambda: 0.0), "closure")
    trainer.close()

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = gltorch.distribute(model, opt, **job_kwargs())
    F.cross_entropy(model(x), y).backward()
    expect_training_error("GradScaler", lambda: opt.step(grad_scaler=object()), "GradScaler")
    trainer.close()

    model = Net().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    expect_training_error("float64 parameters",
                          lambda: gltorch.distribute(model, opt, **job_kwargs()), "float64")

    if check.failed:
        return 1
    print("torch_errors: all checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
