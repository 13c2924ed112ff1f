"""What machine a benchmark ran on: CPU, cores, memory, load, and the versions of what was measured.

A figure without its machine cannot be compared with anything, so every bench report starts here.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass, fields
from importlib import metadata

# CPU features that decide which kernels OpenVINO and PyTorch pick for these models.
_NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Packages:
    """The versions of what was measured ("not installed" where absent); as JSON, by their distribution names."""

    openvino: str
    openvino_genai: str
    openvino_tokenizers: str
    transformers: str
    torch: str
    optimum_intel: str
    nncf: str

    def to_json(self) -> dict[str, str]:
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Machine:
    """What a run ran on: written into a bench's and a run's JSON as its fields (to_json)."""

    cpu: str
    cpu_features: list[str]  # the notable flags, e.g. ["avx2", "avx512f"]
    logical_cores: int
    physical_cores: int
    ram_bytes: int
    os: str  # platform.platform()
    python: str
    packages: Packages
    load_average: list[float]  # 1, 5, 15 minutes, when described

    def to_json(self) -> dict:
        return {**asdict(self), "packages": self.packages.to_json()}


def describe() -> Machine:
    """CPU model and features, logical and physical cores, RAM (bytes), OS, package versions, load now."""
    import psutil

    packages = Packages(*(_version(f.name.replace("_", "-")) for f in fields(Packages)))
    return Machine(cpu=cpu_name(), cpu_features=cpu_features(), logical_cores=os.cpu_count(),
                   physical_cores=psutil.cpu_count(logical=False), ram_bytes=psutil.virtual_memory().total,
                   os=platform.platform(), python=platform.python_version(), packages=packages,
                   load_average=load_average())


def compile_facts() -> dict:
    """What compiled kernels and their measurements depend on: the CPU, its flags and the OpenVINO compiling for it."""
    import openvino as ov

    return {**cpu_facts(), "openvino": ov.get_version()}


def cpu_facts() -> dict:
    """The CPU part of compile_facts, known without loading OpenVINO."""
    return {"cpu": cpu_name(), "flags": cpu_features()}


def cpu_name() -> str:
    return _cpuinfo().get("model name", platform.processor() or "unknown")


def cpu_features() -> list[str]:
    """The notable instruction-set flags of this CPU, e.g. ["avx2", "avx512f", "amx_int8"]."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [flag for flag in _NOTABLE_FLAGS if flag in flags]


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or taskset can narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (runnable processes); above the core count means queueing."""
    return [round(x, 2) for x in os.getloadavg()]


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty off Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # end of the first processor
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"
