"""Builds the optional compiled leaf helpers of the signature, ``src/tripwire/core/_speedups.c``.

Everything else about the package is in pyproject.toml. Without a C compiler, or if the build
fails, tripwire installs anyway and runs their pure-Python twins in
``tripwire/core/signature.py``: the same signatures and verdicts, slower per call. Set
``TRIPWIRE_NO_EXTENSIONS=1`` to skip the build (and, at run time, to ignore a built one).
"""

import os

from setuptools import Extension, setup

SKIP = os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0")

setup(
    ext_modules=[]
    if SKIP
    else [Extension("tripwire.core._speedups", ["src/tripwire/core/_speedups.c"], optional=True)]
)
