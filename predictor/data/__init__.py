"""Bundled package data (built by scripts/build_data.py; provenance in PROVENANCE.md)."""
