"""Which of ggml's CPU kernels this process runs, chosen for the CPU it is on.

llama-cpp-python is built with one copy of ggml's CPU backend per x86 family
(`scripts/build-llama-cpp-python.sh`: `GGML_BACKEND_DL`, `GGML_CPU_ALL_VARIANTS`), so one wheel
runs on any x86-64 CPU. ggml's own loader looks for them beside the executable or in the
working directory, not in `llama_cpp/lib`; so we load one ourselves, before llama.cpp starts:
the one ggml scores highest for this CPU (its own `ggml_backend_score`), never an AMX one
unless named (llama.cpp #20824: `ggml_backend_amx_mul_mat` segfaults on the first multi-token
batch), or the one `cpu_variant` names. A wheel built without variants (`GGML_NATIVE`) has its
backend linked in: "built-in".
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from ..errors import SetupError

__all__ = ["AMX_VARIANTS", "CpuBackend", "cpu_model", "load_cpu_backend", "variants"]

AMX_VARIANTS = frozenset({"sapphirerapids"})
"""Variants whose AMX kernels crash (left out of our builds; refused unless named)."""
_PREFIX = "libggml-cpu-"


@dataclass(frozen=True)
class CpuBackend:
    variant: str
    """The variant loaded ("haswell", "zen4", ...), or "built-in" (no variants in the build)."""
    cpu: str
    """The CPU's model name."""

    def describe(self) -> str:
        return f"{self.cpu}, ggml CPU variant {self.variant}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _lib_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def variants(lib_dir: Path | None = None) -> dict[str, Path]:
    """The CPU variants in the build, by name."""
    lib_dir = lib_dir or _lib_dir()
    return {p.name[len(_PREFIX):-3]: p for p in sorted(lib_dir.glob(f"{_PREFIX}*.so"))}


def _score(path: Path) -> int:
    """ggml's score of a variant for this CPU (0: the CPU cannot run it), as its loader asks."""
    lib = ctypes.CDLL(str(path))
    try:
        fn = lib.ggml_backend_score
        fn.restype = ctypes.c_int
        return int(fn())
    finally:
        import _ctypes

        _ctypes.dlclose(lib._handle)


_loaded: list[CpuBackend] = []


def load_cpu_backend(variant: str | None = None) -> CpuBackend:
    """Load the CPU backend once per process (later calls return the first choice, whatever
    they ask). `variant`: a name from `variants()`; None: the best this CPU runs."""
    if not _loaded:
        _loaded.append(_load(variant))
    return _loaded[0]


def _registry(lib_dir: Path) -> ctypes.CDLL:
    """The copy of libggml libllama links (a wheel holds libggml.so and libggml.so.0 as two
    files, so two backend registries: llama.cpp reads the one of libggml.so.0)."""
    registry = lib_dir / "libggml.so.0"
    return ctypes.CDLL(str(registry if registry.exists() else lib_dir / "libggml.so"))


def _load(variant: str | None) -> CpuBackend:
    found = variants()
    cpu = cpu_model()
    if not found:
        if variant not in (None, "built-in"):
            raise SetupError(f"cpu_variant {variant!r}: this llama-cpp-python has its CPU "
                             "backend built in (no variants); rebuild it with `make install`")
        return CpuBackend("built-in", cpu)
    if variant is not None:
        if variant not in found:
            raise SetupError(f"cpu_variant {variant!r} is not in this build (it has "
                             f"{', '.join(found)})")
        if _score(found[variant]) <= 0:
            raise SetupError(f"cpu_variant {variant!r}: this CPU ({cpu}) lacks instructions "
                             "it needs")
        chosen = variant
    else:
        scores = {name: _score(p) for name, p in found.items() if name not in AMX_VARIANTS}
        chosen = max(scores, key=lambda n: scores[n])
        if scores[chosen] <= 0:
            raise SetupError(f"no CPU variant of this build runs on {cpu} "
                             f"({', '.join(found)})")
    import llama_cpp  # noqa: F401 - libllama first: it loads libggml.so.0 beside itself

    load = _registry(next(iter(found.values())).parent).ggml_backend_load
    load.argtypes = [ctypes.c_char_p]
    load.restype = ctypes.c_void_p
    if not load(str(found[chosen]).encode()):
        raise SetupError(f"ggml could not load its CPU variant {found[chosen]}")
    return CpuBackend(chosen, cpu)


class Threadpool:
    """ggml's CPU threadpool, made once and kept for a context's life, as llama-server does
    (`llama_attach_threadpool`): without one, ggml starts and joins its compute threads on every
    `llama_decode`, a step's worth of thread start-up and cold caches per token. Its threads
    poll a while for the next step before they sleep (ggml's default, hybrid polling 50)."""

    def __init__(self, n_threads: int):
        load_cpu_backend()
        ggml = _registry(_lib_dir())
        ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        ggml.ggml_threadpool_params_init.argtypes = [ctypes.c_void_p, ctypes.c_int]
        dev = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        reg = ggml.ggml_backend_dev_backend_reg(dev) if dev else None
        new = reg and ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_new")
        free = reg and ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_free")
        if not (new and free):
            raise SetupError("ggml's CPU backend has no threadpool to make")
        # filled by ggml itself (its defaults: no affinity mask, normal priority, poll 50), so
        # no copy of its layout here: a buffer larger than the struct (512 mask bytes and 16)
        self._params = ctypes.create_string_buffer(2048)
        ggml.ggml_threadpool_params_init(self._params, n_threads)
        self._new = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(new)
        self._free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(free)
        self.handle: int | None = self._new(self._params)
        if not self.handle:
            raise SetupError(f"ggml could not start a threadpool of {n_threads} threads")

    def close(self) -> None:
        if self.handle:
            self._free(self.handle)
            self.handle = None
