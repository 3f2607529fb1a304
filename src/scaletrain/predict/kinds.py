"""The op kinds the performance model prices and the features each kind's cost depends on (ops.py
explains them); torch-free, so the laws and the model read them without importing torch."""

KINDS = ("conv", "dwconv", "linear", "norm", "pool", "eltwise")
FEATURES = {
    "conv": ("n", "cin", "cout", "h", "w", "k", "stride", "grad_in"),
    "dwconv": ("n", "c", "h", "w", "k", "stride", "grad_in"),
    "linear": ("n", "fin", "fout", "grad_in"),
    "norm": ("n", "c", "hw"),
    "pool": ("n", "c", "h", "w", "k", "stride"),
    "eltwise": ("elements", "inputs"),
}
