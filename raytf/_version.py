"""raytf's version, in a module of its own so that raytf's internals can name it without importing
the package root."""

__version__ = "0.1.0"
