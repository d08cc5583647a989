"""The GPUStack and vLLM releases this package is written against, and the runtime check.

The server plugin reaches into GPUStack internals (its schemas, scheduler, proxy), so it
only claims support for the exact release it was written and tested against.
"""

from dataclasses import dataclass
from importlib import metadata
from typing import Optional

SUPPORTED_GPUSTACK_VERSION = "2.3.0"
SUPPORTED_VLLM_VERSION = "0.32.0"


@dataclass(frozen=True)
class VersionCheck:
    component: str
    installed: Optional[str]
    supported: str

    @property
    def ok(self) -> bool:
        return self.installed == self.supported

    @property
    def reason(self) -> str:
        if self.ok:
            return ""
        if self.installed is None:
            return f"{self.component} is not installed (supported: {self.supported})"
        return (
            f"{self.component} {self.installed} is not the supported "
            f"{self.component} {self.supported}"
        )


def installed_version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except Exception:  # not installed, or metadata unreadable: either way, not supported
        return None


def installed_gpustack_version() -> Optional[str]:
    return installed_version("gpustack")


def check_gpustack() -> VersionCheck:
    return VersionCheck("GPUStack", installed_gpustack_version(), SUPPORTED_GPUSTACK_VERSION)
