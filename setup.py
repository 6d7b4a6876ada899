"""The package's C parts. They are optional: without a compiler dftrace runs in pure
Python. ``DFTRACE_REQUIRE_SPEEDUPS=1`` at install time makes a failed C build fail the
install instead (CI sets it, so a broken engine cannot pass unnoticed)."""

import os
import sys
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

#: Installed beside the package: each interpreter start of the environment runs it, so
#: that DFTRACE_ENABLE=1 traces a program that never imports dftrace (dftrace/_startup.py).
PTH = "dftrace-autostart.pth"
PTH_LINE = ('import os; os.environ.get("DFTRACE_ENABLE", "").strip().lower() not in ("", "0", "false", "no", "off") '
            'and __import__("dftrace._startup").__dict__["_startup"].start()\n')


class BuildPyWithStartup(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, PTH)
        with open(target, "w") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


commands = {"build_py": BuildPyWithStartup}
try:  # pip install -e: the editable wheel gets the file too
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheelWithStartup(editable_wheel):
        def _install_namespaces(self, *args, **kwargs):
            super()._install_namespaces(*args, **kwargs)
            # Its first argument is the directory the editable wheel is made from.
            where = args[0] if args else kwargs.get("installation_dir")
            if where:
                with open(os.path.join(where, PTH), "w") as f:
                    f.write(PTH_LINE)

    if hasattr(editable_wheel, "_install_namespaces"):
        commands["editable_wheel"] = EditableWheelWithStartup
except ImportError:
    pass

required = os.environ.get("DFTRACE_REQUIRE_SPEEDUPS", "").strip() not in ("", "0")

setup(cmdclass=commands, ext_modules=[
    # The recording engine, one module in units, each with its header (CONTRIBUTING.md maps them):
    # records, span styles, encoder, writer loop, shared-memory ring.
    Extension("dftrace._core._speedups", sorted(glob("dftrace/_core/engine_c/*.c")),
              depends=sorted(glob("dftrace/_core/engine_c/*.h")), optional=not required),
    # The file-I/O interposer (Linux, glibc): wrappers of libc's file calls bound into
    # the GOT of the loaded objects; loaded only when file I/O tracing is asked for.
    *([Extension("dftrace._core._io", sorted(glob("dftrace/_core/io_c/*.c")),
                 depends=[*sorted(glob("dftrace/_core/io_c/*.h")),
                          "dftrace/_core/engine_c/io_sink.h", "dftrace/_core/engine_c/digits.h"],
                 libraries=["dl"],
                 extra_compile_args=["-fvisibility=hidden"], optional=not required)]
      if sys.platform.startswith("linux") else []),
    # The trace readers' decoders of whole gzip members and zstd frames (the system's
    # libdeflate and libzstd, opened at first use); without them the readers stream.
    Extension("dftrace.format._members", ["dftrace/format/members.c"],
              libraries=["dl"] if sys.platform.startswith("linux") else [], optional=not required),
    # The reader of trace lines for analysis and its interval sweeps; without it loading
    # parses with polars alone and the sweeps run in numpy.
    Extension("dftrace.analysis.runtime._kernels", ["dftrace/analysis/runtime/scan.c", "dftrace/analysis/runtime/sweeps.c"],
              optional=not required),
])
