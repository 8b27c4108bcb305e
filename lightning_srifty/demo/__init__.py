"""Demo models and data that ship with the package (no downloads): a CNN on digits, a tiny LM on synthetic tokens."""
