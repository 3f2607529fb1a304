"""Exports of recorded runs to other tools' formats: Chrome/Perfetto traces, TensorBoard scalars."""
