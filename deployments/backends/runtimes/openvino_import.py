"""OpenVINO, imported so that it runs inside a replica as it does in a plain process.

Two things of OpenVINO's go wrong in a replica:

- Its thread library (TBB) opens hwloc, which reads the machine's topology, in a lookup
  scope of its own (RTLD_DEEPBIND). hwloc's `free` then binds to glibc's even where the
  replica preloads jemalloc (config/allocator.py), while the strings glibc hands hwloc
  come from jemalloc: the first `compile_model` aborts ("munmap_chunk(): invalid pointer",
  "double free or corruption"). Seen on an Intel Xeon with AMX, where TBB asks hwloc for
  the NUMA nodes; not on an AMD EPYC. Loaded first, in the global scope, hwloc binds like
  the rest of the process, and TBB reuses that copy.
- `import openvino` sends a usage event to Intel from a process it forks. A fork of a
  replica, with Ray's and gRPC's threads running, is not safe, and a server has no
  business reporting its host. OpenVINO's telemetry stands down where `CI` is true: the
  import runs with it set, and the process's environment is put back after.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import threading
from pathlib import Path
from types import ModuleType

_TELEMETRY_OFF = "CI"
# Two model threads may build OpenVINO runtimes at once: one import, one environment change.
_IMPORTING = threading.Lock()


def openvino_libs() -> Path | None:
    """The folder of OpenVINO's native libraries, or None where the package is missing."""
    spec = importlib.util.find_spec("openvino")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "libs"


def preload_hwloc(libs: Path | None) -> list[str]:
    """Loads the hwloc OpenVINO carries into the global scope; returns what it loaded."""
    if libs is None:
        return []
    loaded = []
    for path in sorted(glob.glob(str(libs / "libhwloc.so*"))):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        loaded.append(Path(path).name)
    return loaded


def import_openvino() -> ModuleType:
    """`openvino`, imported once per process the safe way (see the module's doc)."""
    with _IMPORTING:
        return _import_once()


@functools.cache
def _import_once() -> ModuleType:
    preload_hwloc(openvino_libs())
    before = os.environ.get(_TELEMETRY_OFF)
    os.environ[_TELEMETRY_OFF] = "true"
    try:
        import openvino
    finally:
        if before is None:
            os.environ.pop(_TELEMETRY_OFF, None)
        else:
            os.environ[_TELEMETRY_OFF] = before
    return openvino
