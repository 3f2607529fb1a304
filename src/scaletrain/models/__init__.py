"""Model zoo: built-in image classifiers by name, user factories, and their parameter/FLOP counts."""

from scaletrain.models.catalog import model_rows
from scaletrain.models.measure import count_params, forward_flops
from scaletrain.models.registry import build_model, model_names

__all__ = ["build_model", "count_params", "forward_flops", "model_names", "model_rows"]
