"""The package version, in one place: ``streammem_kernels.__version__``, ``streammem.__version__`` and the
distribution's metadata (``pyproject.toml``: ``[tool.setuptools.dynamic]``) all read it from here.  Changes
are listed in ``CHANGELOG.md``."""

__version__ = "0.1.0"
