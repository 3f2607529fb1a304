"""The op kinds the performance model prices and the features each kind's cost depends on (ops.py
explains them); torch-free, so the laws and the model read them without importing torch."""

KINDS = ("conv", "dwconv", "linear", "norm", "pool", "avgpool", "eltwise")
FEATURES = {
    "conv": ("n", "cin", "cout", "h", "w", "k", "stride", "grad_in"),
    "dwconv": ("n", "c", "h", "w", "k", "stride", "grad_in"),
    "linear": ("n", "fin", "fout", "grad_in"),
    "norm": ("n", "c", "hw"),
    "pool": ("n", "c", "h", "w", "k", "stride"),  # max pooling
    "avgpool": ("n", "c", "h", "w", "k", "stride"),  # average pooling: another kernel (backward ~6x max's here)
    "eltwise": ("elements", "inputs"),
}
# What bounds an op's time: arithmetic ("compute": dense multiply-adds) or moving memory ("memory").
# Inside a real step a memory-bound op meets colder caches than when it is timed alone, so the two
# groups get their own loop factors (predict/points.py).
GROUP = {"conv": "compute", "linear": "compute", "dwconv": "memory", "norm": "memory", "pool": "memory",
         "avgpool": "memory", "eltwise": "memory"}
