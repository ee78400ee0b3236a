"""raytf's version, in a module of its own so that raytf's internals can name it without importing
the package root."""

__version__ = "0.1.0"

# The versions raytf's tests run against (noxfile.py): the whole suite on the newest, the fast and
# integration tiers on the oldest, which are pyproject.toml's lower bounds. The cluster manifests
# and image pin the newest Ray.
NEWEST = {"tensorflow": "2.21", "keras": "3.15", "tf_keras": "2.21", "ray": "2.60.0"}
OLDEST = {"tensorflow": "2.16", "keras": "3.10", "tf_keras": "2.16", "ray": "2.50.1"}
