"""Builds the optional compiled leaf helpers: the signature's, ``src/tripwire/core/_speedups.c``,
the result digest's mask, ``src/tripwire/core/_resultmask.c``, the OTLP wire scanner,
``src/tripwire/spans/_otlpscan.c``, and the OTLP/JSON fast path, ``src/tripwire/spans/_otlpjson.c``.

Everything else about the package is in pyproject.toml. Without a C compiler, or if a build
fails, tripwire installs anyway and runs their pure-Python twins (``tripwire/core/signature.py``,
``tripwire/spans/_wire.py``, the msgspec decoder of ``tripwire/spans/otlp.py``): the same
signatures, spans and verdicts, slower per call. Set ``TRIPWIRE_NO_EXTENSIONS=1`` to skip the
build (and, at run time, to ignore a built one).
"""

import os

from setuptools import Extension, setup

SKIP = os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0")

try:  # setuptools >= 70.1 ships bdist_wheel; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel package: ``setup.py build_ext`` still works
        from setuptools import Command as bdist_wheel


class PureUnlessBuilt(bdist_wheel):
    """Tag the wheel for a platform only if the optional extension was actually built.

    Without a compiler the build of the optional extension fails quietly, and the wheel holds
    only Python: it must then be ``py3-none-any``, not tagged for this platform.
    """

    def get_tag(self):
        build_ext = self.get_finalized_command("build_ext")
        built = any(
            os.path.exists(os.path.join(build_ext.build_lib, build_ext.get_ext_filename(e.name)))
            for e in build_ext.extensions
        )
        if not built:
            self.root_is_pure = True
        return super().get_tag()


setup(
    ext_modules=[]
    if SKIP
    else [
        Extension("tripwire.core._speedups", ["src/tripwire/core/_speedups.c"], optional=True),
        Extension("tripwire.core._resultmask", ["src/tripwire/core/_resultmask.c"], optional=True),
        Extension("tripwire.core._watchstep", ["src/tripwire/core/_watchstep.c"], optional=True),
        Extension("tripwire.spans._otlpscan", ["src/tripwire/spans/_otlpscan.c"], optional=True),
        Extension("tripwire.spans._otlpjson", ["src/tripwire/spans/_otlpjson.c"], optional=True),
    ],
    cmdclass={"bdist_wheel": PureUnlessBuilt},
)
