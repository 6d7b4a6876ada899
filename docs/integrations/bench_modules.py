"""Cost of trace_modules per hooked module call (CPU, tiny layers so hooks dominate)."""
import tempfile, time, torch
from torch import nn
import dftrace, dftrace.torch as dft

N = 50
model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(N)])
x = torch.randn(1, 16)

def fwd():
    with torch.no_grad():
        model(x)

def fwd_bwd():
    model(x).sum().backward()

def timed(step, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps

configs = {
    "no hooks": (fwd, None),
    "hooks installed, tracing off": (fwd, dict()),
    "traced, shapes=True": (fwd, dict(on=True)),
    "traced, shapes=False": (fwd, dict(on=True, shapes=False)),
    "fwd+bwd, no hooks": (fwd_bwd, None),
    "fwd+bwd, backward=True, off": (fwd_bwd, dict(backward=True)),
    "fwd+bwd, backward=True, traced": (fwd_bwd, dict(on=True, backward=True)),
}
best = {k: float("inf") for k in configs}
log = tempfile.mkdtemp() + "/b"
for _ in range(7):
    for name, (step, opts) in configs.items():
        opts = dict(opts) if opts is not None else None
        on = opts.pop("on", False) if opts is not None else False
        if on:
            dftrace.initialize(log_file=log, compression="zstd")
        tm = dft.trace_modules(model, **opts) if opts is not None else None
        step()
        best[name] = min(best[name], timed(step, 300))
        if tm is not None:
            tm.remove()
        if on:
            dftrace.finalize()
print(f"{N} x Linear(16, 16), batch 1, CPU, torch {torch.__version__}; best of 7 rounds")
for name, t in best.items():
    base = best["fwd+bwd, no hooks"] if name.startswith("fwd+bwd") else best["no hooks"]
    print(f"{name:<32} {t * 1e6:9.1f} us per call  {(t - base) / N * 1e6:7.2f} us per module")
