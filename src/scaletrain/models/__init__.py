"""Model zoo: built-in image classifiers by name and user factories (their costs: scaletrain.perf)."""

from scaletrain.models.catalog import model_rows
from scaletrain.models.registry import build_model, model_names

__all__ = ["build_model", "model_names", "model_rows"]
