"""The seed's autograd walkthroughs as one notebook cell, and plain-Python reference
gradients to check its output against. No dependencies: the integration test runs the
cell in a spawned server, bench/load.py under load, scripts/gpu-host-check.sh on a GPU."""

from __future__ import annotations

import math

AUTOGRAD_CELL = r'''
import json, torch
from torch.autograd import grad
device = "cuda" if torch.cuda.is_available() else "cpu"
out = {"device": device, "torch": torch.__version__}

# y = w*x + b, loss = (y - 5)^2 at w=2, x=3, b=1
w = torch.tensor(2.0, device=device, requires_grad=True)
x = torch.tensor(3.0, device=device, requires_grad=True)
b = torch.tensor(1.0, device=device, requires_grad=True)
loss = (w * x + b - 5) ** 2
loss.backward()
out["linear"] = {"loss": loss.item(), "w": w.grad.item(), "x": x.grad.item(), "b": b.grad.item(),
                 "grad_device": str(w.grad.device)}

# (x^2 - 4)^2 has a minimum at x = 2: gradient 0
x = torch.tensor([2.0], device=device, requires_grad=True)
((x ** 2 - 4) ** 2).backward()
out["minimum"] = x.grad.item()

# first and second derivatives of sum(x^3) at [2, -1] (create_graph=True)
x = torch.tensor([2.0, -1.0], device=device, requires_grad=True)
d1 = grad((x ** 3).sum(), x, create_graph=True)[0]
d2 = grad(d1.sum(), x)[0]
out["cubic"] = {"first": d1.tolist(), "second": d2.tolist()}

# tanh/matmul chain: loss = sum(tanh(X @ W + B)^3)
torch.manual_seed(0)
X = torch.randn(4, 3, device=device, requires_grad=True)
W = torch.randn(3, 2, device=device, requires_grad=True)
B = torch.zeros(2, device=device, requires_grad=True)
(torch.tanh(X @ W + B) ** 3).sum().backward()
out["chain"] = {n: {"value": t.tolist(), "grad": t.grad.tolist(), "shape": list(t.grad.shape)}
                for n, t in (("X", X), ("W", W), ("B", B))}
print(json.dumps(out))
'''


def chain_grads(X, W, B):
    """Reference gradients of sum(tanh(XW+B)^3) in plain Python: dL/dZ = 3 a^2 (1 - a^2)."""
    n, k, m = len(X), len(W), len(B)
    dZ = [[0.0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            a = math.tanh(sum(X[i][t] * W[t][j] for t in range(k)) + B[j])
            dZ[i][j] = 3 * a * a * (1 - a * a)
    dW = [[sum(X[i][t] * dZ[i][j] for i in range(n)) for j in range(m)] for t in range(k)]
    dX = [[sum(dZ[i][j] * W[t][j] for j in range(m)) for t in range(k)] for i in range(n)]
    dB = [sum(dZ[i][j] for i in range(n)) for j in range(m)]
    return dX, dW, dB


def close(a, b, tol=1e-4):
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b, strict=True))
    return abs(a - b) <= tol * max(1.0, abs(b))


def check_result(result: dict, device: str) -> None:
    """Assert that *result* (the cell's printed JSON) has the walkthroughs' exact
    gradients, computed on *device* ("cpu" or "cuda")."""
    assert result["device"] == device, result
    assert result["linear"]["grad_device"].startswith(device)
    assert result["linear"]["loss"] == 4.0
    assert (result["linear"]["w"], result["linear"]["x"], result["linear"]["b"]) == (12.0, 8.0, 4.0)
    assert result["minimum"] == 0.0
    assert result["cubic"] == {"first": [12.0, 3.0], "second": [12.0, -6.0]}
    chain = result["chain"]
    assert [chain[n]["shape"] for n in ("X", "W", "B")] == [[4, 3], [3, 2], [2]]
    dX, dW, dB = chain_grads(chain["X"]["value"], chain["W"]["value"], chain["B"]["value"])
    assert close(chain["X"]["grad"], dX)
    assert close(chain["W"]["grad"], dW)
    assert close(chain["B"]["grad"], dB)
