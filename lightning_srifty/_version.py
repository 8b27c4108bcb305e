"""The release, in one place (the package root and the profile's software record read it)."""

__version__ = "0.2.0"
