"""Scaling studies: a grid of training launches, resumable, summarised in study.json (see docs/study.md)."""
