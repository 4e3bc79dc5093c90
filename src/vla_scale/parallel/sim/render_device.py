"""Which EGL device a simulator process renders on: the GPU of the rank that owns it.

MuJoCo (and robosuite, under LIBERO) render on the EGL device `MUJOCO_EGL_DEVICE_ID` names, an index into
`eglQueryDevicesEXT`'s list, and on device 0 when it is unset: on a node of 8 GPUs every simulator would render on
one. EGL's list is not CUDA's: it holds every GPU whatever `CUDA_VISIBLE_DEVICES` says, its order need not be CUDA's
(containers renumber), and Mesa's software device may be in it. So the index is found by asking each EGL device which
CUDA device it is (`EGL_CUDA_DEVICE_NV`), in the rank's own process, where CUDA ordinals mean what the rank's
`torch.cuda` means by them. The simulator processes then get that index, and no `CUDA_VISIBLE_DEVICES` (they use no
CUDA, and robosuite refuses an EGL index that is not a member of that list). Without EGL, without a GPU, with
another `MUJOCO_GL` or with `MUJOCO_EGL_DEVICE_ID` already set by the user, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence

EGL_CUDA_DEVICE_NV = 0x323A
"""EGL_NV_device_cuda: the CUDA device an EGL device is."""


def egl_device_for(cuda_ordinal: int, cuda_of_egl: Sequence[int | None]) -> int:
    """The index, in EGL's device list, of the device CUDA calls `cuda_ordinal`; `cuda_of_egl[i]` is what EGL device
    i answers to `EGL_CUDA_DEVICE_NV` (None: not a CUDA device, or not visible to CUDA here)."""
    matches = [i for i, ordinal in enumerate(cuda_of_egl) if ordinal == cuda_ordinal]
    if len(matches) != 1:
        raise ValueError(f"CUDA device {cuda_ordinal} is {len(matches)} of the {len(cuda_of_egl)} EGL devices "
                         f"(their CUDA devices: {list(cuda_of_egl)}); set MUJOCO_EGL_DEVICE_ID to the EGL index "
                         "the simulators should render on")
    return matches[0]


def egl_cuda_devices() -> list[int | None] | None:
    """What each EGL device (in `eglQueryDevicesEXT` order) answers to `EGL_CUDA_DEVICE_NV`; None when this process
    has no EGL with device enumeration."""
    try:
        egl = ctypes.CDLL("libEGL.so.1")
    except OSError:
        return None
    egl.eglGetProcAddress.restype = ctypes.c_void_p
    egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    query_devices = egl.eglGetProcAddress(b"eglQueryDevicesEXT")
    query_attrib = egl.eglGetProcAddress(b"eglQueryDeviceAttribEXT")
    if not query_devices or not query_attrib:
        return None
    devices_fn = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_int))(query_devices)
    attrib_fn = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_ssize_t))(query_attrib)
    count = ctypes.c_int(0)
    if not devices_fn(0, None, ctypes.byref(count)) or count.value <= 0:
        return None
    devices = (ctypes.c_void_p * count.value)()
    if not devices_fn(count.value, devices, ctypes.byref(count)):
        return None
    answers: list[int | None] = []
    for device in devices[: count.value]:
        value = ctypes.c_ssize_t(-1)
        answers.append(int(value.value) if attrib_fn(device, EGL_CUDA_DEVICE_NV, ctypes.byref(value)) else None)
    return answers


def render_environment(cuda_ordinal: int | None, environ: Mapping[str, str] | None = None,
                       cuda_of_egl: Sequence[int | None] | None = None) -> dict[str, str | None]:
    """The environment variables a simulator process of the rank on CUDA device `cuda_ordinal` gets (a value of None
    removes the variable): `MUJOCO_EGL_DEVICE_ID` of that GPU, `CUDA_VISIBLE_DEVICES` removed. Empty where nothing
    is to change (see the module docstring). `environ` and `cuda_of_egl` default to this process's."""
    environ = os.environ if environ is None else environ
    if cuda_ordinal is None or "MUJOCO_EGL_DEVICE_ID" in environ or environ.get("MUJOCO_GL", "egl") != "egl":
        return {}
    found = egl_cuda_devices() if cuda_of_egl is None else cuda_of_egl
    if not found or all(ordinal is None for ordinal in found):
        return {}  # no EGL device is a CUDA device: software rendering, as before
    return {"MUJOCO_EGL_DEVICE_ID": str(egl_device_for(cuda_ordinal, found)), "CUDA_VISIBLE_DEVICES": None}
