"""Registry: method name -> ``module:attribute`` of its :class:`MethodSpec`.

Adding an approximation is one new file in ``approxlab/methods/`` and one line here;
it then appears in :func:`available`, in every study and in the common tests.
"""

from __future__ import annotations

import importlib

from ._base import MethodSpec

__all__ = ["available", "get"]

_REGISTRY = {
    "exact": "exact:EXACT",
    "kernelized": "kernelized:KERNELIZED",
    "skyformer": "skyformer:SKYFORMER",
    "skyformer-softmax": "skyformer_softmax:SKYFORMER_SOFTMAX",
    "nystrom": "nystrom:NYSTROM",
    "nystromformer": "nystromformer:NYSTROMFORMER",
    "spectral-shifting": "spectral_shifting:SPECTRAL_SHIFTING",
    "yoso": "yoso:YOSO",
    "yoso-e": "yoso_e:YOSO_E",
    "performer": "performer:PERFORMER",
    "informer": "informer:INFORMER",
    "linformer": "linformer:LINFORMER",
}


def available() -> list[str]:
    """Names accepted by :func:`approxlab.approximate`, in registry order."""
    return list(_REGISTRY)


def get(name: str) -> MethodSpec:
    """The :class:`MethodSpec` registered as ``name``."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"`method` must be one of {available()}; got {name!r}.")
    module, attribute = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
