"""`scaletrain validate`: a prediction (scaletrain predict) against measured runs and studies."""

from scaletrain.validate.load import load_measured, load_prediction
from scaletrain.validate.match import MATCH_KEYS, MeasuredRun, validate

__all__ = ["MATCH_KEYS", "MeasuredRun", "load_measured", "load_prediction", "validate"]
