"""The package version, in a module of its own so that what records it (``plan.json``) does not
import the whole package."""

__version__ = "0.1.0"
