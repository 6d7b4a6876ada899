"""Each integration fails to import, naming the extra to install, when its framework
is missing (runs without any framework: they are blocked in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CODE = r"""
import json, sys
blocked = ["torch", "tensorflow", "keras", "lightning", "transformers"]
for name in blocked:
    sys.modules[name] = None  # what a missing package looks like to `import`
import dftrace  # the core imports without any of them
out = {}
for module in ["torch", "tensorflow", "keras", "lightning", "transformers"]:
    try:
        __import__("dftrace." + module)
    except ImportError as exc:
        out[module] = str(exc)
    else:
        out[module] = None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def messages():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["torch", "tensorflow", "keras", "lightning", "transformers"])
def test_missing_framework_names_the_extra(messages, module):
    """`import dftrace.<module>` without its framework raises ImportError naming pip install 'dftrace[<module>]'."""
    assert messages[module] is not None
    assert f"pip install 'dftrace[{module}]'" in messages[module]
