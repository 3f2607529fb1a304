"""The shapes `scaletrain calibrate` times, per op kind: a fixed-seed sample over the ranges vision
models use (channels 1-512, images 4-112 pixels, kernels 1-11, strides 1-4, batches 4-256), each
capped in arithmetic so no single shape takes long on a CPU. `--quick` takes a fifth of them."""

from __future__ import annotations

import random

CAP_MACS = {"conv": 4e8, "linear": 2e8}  # multiply-adds per shape, at most (a few tens of ms on one core)
CAP_ELEMENTS = 1.5e7


def shapes(kind: str, count: int, seed: int = 0) -> list[dict[str, int]]:
    rng = random.Random(f"{kind}-{seed}")
    out: list[dict[str, int]] = []
    seen: set[tuple] = set()
    tries = 0
    while len(out) < count and tries < count * 200:
        tries += 1
        f = _draw(kind, rng)
        if f is None:
            continue
        key = tuple(sorted(f.items()))
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _draw(kind: str, rng: random.Random) -> dict[str, int] | None:
    batch = rng.choice([4, 8, 16, 32, 48, 64, 96, 128, 192, 256])
    if kind == "conv":
        side = rng.choice([4, 7, 8, 14, 16, 28, 32, 56, 64, 112])
        if rng.random() < 0.15:  # a first layer: image channels in, larger kernels
            cin, k = rng.choice([1, 3]), rng.choice([3, 5, 7, 11])
            cout = rng.choice([6, 16, 24, 32, 48, 64, 96])
        else:
            cin = rng.choice([6, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512])
            cout = int(cin * rng.choice([0.25, 0.5, 1, 1, 1, 2, 2, 4]))
            k = rng.choices([1, 3, 5], weights=[3, 8, 1])[0]
            if not 8 <= cout <= 1024:
                return None
        stride = rng.choices([1, 2, 4], weights=[6, 3, 1 if k >= 7 else 0])[0]
        if k > side:
            return None
        f = {"n": batch, "cin": cin, "cout": cout, "h": side, "w": side, "k": k, "stride": stride,
             "grad_in": int(cin > 3 and rng.random() < 0.85)}
        macs = batch * cout * (-(-side // stride)) ** 2 * cin * k * k
        return f if 1e4 <= macs <= CAP_MACS["conv"] else None
    if kind == "dwconv":
        c = rng.choice([16, 32, 64, 96, 128, 256, 512])
        side = rng.choice([4, 7, 8, 14, 16, 28, 32, 56])
        k, stride = rng.choice([3, 3, 5]), rng.choice([1, 1, 2])
        f = {"n": batch, "c": c, "h": side, "w": side, "k": k, "stride": stride, "grad_in": int(rng.random() < 0.9)}
        return f if batch * c * side * side <= CAP_ELEMENTS else None
    if kind == "linear":
        fin = rng.choice([16, 64, 84, 120, 128, 256, 400, 512, 784, 1024, 2048, 3072, 4096, 9216])
        fout = rng.choice([2, 10, 84, 100, 120, 128, 256, 512, 1000, 1024, 2048, 4096])
        f = {"n": batch, "fin": fin, "fout": fout, "grad_in": int(rng.random() < 0.8)}
        return f if batch * fin * fout <= CAP_MACS["linear"] else None
    if kind == "norm":
        c = rng.choice([6, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512, 1024])
        hw = rng.choice([1, 16, 36, 49, 64, 144, 196, 256, 576, 784, 1024, 3136])
        f = {"n": batch, "c": c, "hw": hw}
        return f if batch * c * hw <= CAP_ELEMENTS else None
    if kind in ("pool", "avgpool"):
        c = rng.choice([6, 16, 32, 64, 128, 256, 512])
        side = rng.choice([4, 8, 14, 16, 28, 32, 56, 64])
        k = rng.choice([2, 3])
        stride = rng.choice([1, 2]) if k == 3 else 2
        f = {"n": batch, "c": c, "h": side, "w": side, "k": k, "stride": stride}
        return f if batch * c * side * side <= CAP_ELEMENTS and k <= side else None
    if kind == "eltwise":
        elements = int(10 ** rng.uniform(3, 7.2))
        return {"elements": elements, "inputs": rng.choice([1, 1, 2])}
    raise ValueError(kind)


COUNTS = {"conv": 150, "dwconv": 30, "linear": 40, "norm": 40, "pool": 25, "avgpool": 20, "eltwise": 30}
