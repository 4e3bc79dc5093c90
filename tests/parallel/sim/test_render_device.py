"""The EGL device each simulator process renders on: the one that is the rank's CUDA device, found through what the
EGL devices answer to EGL_CUDA_DEVICE_NV (the order of EGL's list is not CUDA's in containers)."""

import pytest

from vla_scale.parallel.sim.process import _child_environment
from vla_scale.parallel.sim.render_device import egl_cuda_devices, egl_device_for, render_environment


def test_the_egl_device_is_found_by_its_cuda_ordinal_not_its_place():
    assert egl_device_for(0, [None, 1, 0]) == 2  # Mesa's device first, the GPUs in another order than CUDA's
    assert egl_device_for(1, [None, 1, 0]) == 1
    assert egl_device_for(3, [0, 1, 2, 3, 4, 5, 6, 7]) == 3
    with pytest.raises(ValueError, match="MUJOCO_EGL_DEVICE_ID"):
        egl_device_for(2, [None, 0, 1])  # a GPU CUDA sees that EGL does not


def test_simulators_get_the_rank_gpu_and_no_cuda_list():
    found = [None, 1, 0]
    assert render_environment(0, {}, found) == {"MUJOCO_EGL_DEVICE_ID": "2", "CUDA_VISIBLE_DEVICES": None}
    chosen = render_environment(1, {"MUJOCO_GL": "egl", "CUDA_VISIBLE_DEVICES": "4,5"}, found)
    assert chosen["MUJOCO_EGL_DEVICE_ID"] == "1"


@pytest.mark.parametrize("cuda, environ, found", [
    (None, {}, [0]),  # no GPU on this rank
    (0, {"MUJOCO_EGL_DEVICE_ID": "3"}, [0]),  # the user's choice stands
    (0, {"MUJOCO_GL": "osmesa"}, [0]),  # not EGL
    (0, {}, [None]),  # Mesa's software device only
    (0, {}, []),  # no EGL device enumeration
])
def test_nothing_changes_where_there_is_nothing_to_choose(cuda, environ, found):
    assert render_environment(cuda, environ, found) == {}


def test_this_machines_egl_answers_without_failing():
    found = egl_cuda_devices()
    assert found is None or (len(found) >= 1 and all(x is None or x >= 0 for x in found))


def test_a_child_environment_sets_and_removes_variables(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    env = _child_environment({"MUJOCO_EGL_DEVICE_ID": "2", "CUDA_VISIBLE_DEVICES": None})
    assert env["MUJOCO_EGL_DEVICE_ID"] == "2" and "CUDA_VISIBLE_DEVICES" not in env
    assert "glibc.malloc.tcache_count" in env["GLIBC_TUNABLES"]
