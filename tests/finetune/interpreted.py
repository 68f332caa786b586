"""Run a Triton kernel's test code in Triton's interpreter, on CPU tensors.

The interpreter is chosen when a kernel is decorated, so the code runs in a child process started with
TRITON_INTERPRET=1; it prints its findings as JSON on its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_interpreted(child: str, timeout: int = 300) -> Any:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
