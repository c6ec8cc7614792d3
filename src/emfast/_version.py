"""The version of emfast: set here only (pyproject.toml reads it; see CHANGELOG.md)."""
__version__ = "0.2.0"
