"""Sphinx configuration of emfast's API reference: ``python -m sphinx -W -b html docs/api build/docs``."""
from emfast import __version__

project = "emfast"
release = version = __version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say the types, in the words of the field
intersphinx_mapping = {}
html_theme = "alabaster"
exclude_patterns = []
nitpicky = False
# Types written in words in the docstrings ("a path", "path-like") match attributes of several classes (both
# ConfigError and Prediction have a ``path``); those ambiguous links are left out rather than guessed.
suppress_warnings = ["ref.python"]
