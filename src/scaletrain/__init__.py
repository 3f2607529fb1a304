"""scaletrain: train vision models across processes, GPUs and nodes, and see why a job scales as it does."""

__version__ = "0.1.0"

_API = ("api", "load_run", "load_study", "load_prediction", "Run", "Study", "Prediction", "RunFailed")
"""Names of scaletrain.api offered here too. Its launchers stay there (scaletrain.api.train, .study, .predict):
`scaletrain.train`, `.study` and `.predict` are the subpackages that implement them."""


def __getattr__(name: str):
    """scaletrain.api's names, imported on first use: `import scaletrain` stays cheap (no torch). By name,
    at run time, as the lowest module every other imports (for __version__) depends on none of them."""
    if name in _API:
        from importlib import import_module

        api = import_module("scaletrain.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'scaletrain' has no attribute {name!r}")
