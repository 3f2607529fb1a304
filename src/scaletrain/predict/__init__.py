"""Predicting step time, scaling and memory of a training request before it runs."""
