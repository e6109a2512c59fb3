"""Host and GPU readers of ``telemetry.system`` against a fake psutil and a fake pynvml.

The fake mimics nvidia-ml-py's ``pynvml``: the same function names, argument order,
constants and error classes; handles are the fake device objects themselves.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_trainfactory.telemetry.system import (
    GpuDevice,
    gpu_sample,
    host_sample,
    init_nvml,
    nvml_shutdown,
    visible_gpus,
)

GIB = 2**30


# --- fake pynvml -------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    def __str__(self) -> str:
        return "Insufficient Permissions"


@dataclass(eq=False)
class FakeDevice:
    """A GPU or MIG device; ``unsupported`` names the readings that raise NotSupported."""

    uuid: str | bytes
    name: str | bytes = "NVIDIA H200"
    util: int = 87
    mem_used: int = 40 * GIB
    mem_total: int = 141 * GIB
    power_mw: int = 412_345
    temp_c: int = 54
    clocks: dict[int, int] = field(default_factory=lambda: {0: 1500, 1: 1980, 2: 3201})
    unsupported: set[str] = field(default_factory=set)
    mig_mode: int | None = None  # None: MIG not supported on this GPU (NotSupported)
    mig_slots: list[FakeDevice | None] = field(default_factory=list)  # None: empty slot
    max_mig: int = 7


class FakeNvml:
    """Module-like namespace with the slice of pynvml that ``telemetry.system`` uses."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NoPermission = NVMLError_NoPermission
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_GRAPHICS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(
        self,
        devices: list[FakeDevice],
        init_error: Exception | None = None,
        unreadable: set[int] | None = None,  # indices whose handle raises NoPermission
    ) -> None:
        self.devices = devices
        self.init_error = init_error
        self.unreadable = unreadable or set()
        self.calls: list[str] = []

    # library
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        raise NVMLError_Uninitialized()

    # enumeration
    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if not 0 <= index < len(self.devices):
            raise NVMLError_InvalidArgument()
        if index in self.unreadable:
            raise NVMLError_NoPermission()
        return self.devices[index]

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str | bytes:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeDevice) -> str | bytes:
        if "name" in h.unsupported:
            raise NVMLError_NotSupported()
        return h.name

    def nvmlDeviceGetMigMode(self, h: FakeDevice) -> list[int]:
        if h.mig_mode is None:
            raise NVMLError_NotSupported()
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeDevice) -> int:
        if h.mig_mode is None:
            raise NVMLError_NotSupported()
        return h.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeDevice, k: int) -> FakeDevice:
        if h.mig_mode != self.NVML_DEVICE_MIG_ENABLE:
            raise NVMLError_InvalidArgument()
        if k >= h.max_mig:
            raise NVMLError_InvalidArgument()
        if k >= len(h.mig_slots) or h.mig_slots[k] is None:
            raise NVMLError_NotFound()
        return h.mig_slots[k]

    # readings
    def _check(self, h: FakeDevice, what: str) -> None:
        if what in h.unsupported:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetUtilizationRates(self, h: FakeDevice) -> SimpleNamespace:
        self._check(h, "utilization")
        return SimpleNamespace(gpu=h.util, memory=13)

    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice) -> SimpleNamespace:
        self._check(h, "memory")
        return SimpleNamespace(used=h.mem_used, total=h.mem_total, free=h.mem_total - h.mem_used)

    def nvmlDeviceGetPowerUsage(self, h: FakeDevice) -> int:
        self._check(h, "power")
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h: FakeDevice, sensor: int) -> int:
        self._check(h, "temperature")
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return h.temp_c

    def nvmlDeviceGetClockInfo(self, h: FakeDevice, clock: int) -> int:
        self._check(h, "clock")
        return h.clocks[clock]


UUIDS = [
    "GPU-0aaa1111-2222-3333-4444-555566667777",
    "GPU-1bbb1111-2222-3333-4444-555566667777",
    "GPU-2ccc1111-2222-3333-4444-555566667777",
]


def three_gpus(**kwargs: Any) -> FakeNvml:
    return FakeNvml([FakeDevice(uuid=u) for u in UUIDS], **kwargs)


def labels(devices: list[GpuDevice]) -> list[str]:
    return [d.label for d in devices]


# --- init / shutdown ---------------------------------------------------------------

FALLBACK = "sampling CPU and host memory only."


def test_no_library_module_gives_a_sentence_and_nothing_breaks():
    assert init_nvml(None) == (
        "NVML unavailable (the nvidia-ml-py package (module pynvml) is not installed): " + FALLBACK
    )
    assert visible_gpus(None, None) == []
    assert visible_gpus(None, "0") == []
    assert nvml_shutdown(None) is None


def test_shared_library_not_found():
    nvml = three_gpus(init_error=NVMLError_LibraryNotFound())
    assert init_nvml(nvml) == ("NVML unavailable (NVML shared library not found): " + FALLBACK)


def test_library_but_no_driver():
    nvml = three_gpus(init_error=NVMLError_DriverNotLoaded())
    message = init_nvml(nvml)
    assert message == "NVML unavailable (NVIDIA driver not loaded): " + FALLBACK
    assert "driver" in message


def test_other_nvml_error_is_quoted():
    nvml = three_gpus(init_error=NVMLError_NoPermission())
    assert init_nvml(nvml) == "NVML unavailable (Insufficient Permissions): " + FALLBACK


def test_init_success_returns_none_and_shutdown_is_guarded():
    nvml = three_gpus()
    assert init_nvml(nvml) is None
    assert nvml_shutdown(nvml) is None  # the fake's nvmlShutdown raises: swallowed
    assert nvml.calls == ["nvmlInit", "nvmlShutdown"]


# --- gpu_sample ----------------------------------------------------------------------

FULL_SAMPLE = {
    "utilization": 87.0,
    "memory_used_mb": 40960.0,
    "memory_total_mb": 144384.0,
    "power_w": 412.345,
    "temperature_c": 54.0,
    "sm_clock_mhz": 1980.0,
}


def test_gpu_sample_all_fields_exact():
    nvml = three_gpus()
    assert gpu_sample(nvml, nvml.devices[0]) == FULL_SAMPLE


def test_gpu_sample_temperature_and_sm_clock_use_the_right_sensor_and_clock():
    device = FakeDevice(uuid=UUIDS[0], temp_c=71, clocks={0: 1410, 1: 1755, 2: 2619})
    sample = gpu_sample(FakeNvml([device]), device)
    assert sample["temperature_c"] == 71.0
    assert sample["sm_clock_mhz"] == 1755.0  # NVML_CLOCK_SM, not graphics (1410) or mem


def test_power_not_supported_is_none_and_the_rest_still_read():
    device = FakeDevice(uuid=UUIDS[0], unsupported={"power"})
    assert gpu_sample(FakeNvml([device]), device) == {**FULL_SAMPLE, "power_w": None}


def test_every_field_unreadable_is_none_never_zero():
    device = FakeDevice(
        uuid=UUIDS[0], unsupported={"utilization", "memory", "power", "temperature", "clock"}
    )
    assert gpu_sample(FakeNvml([device]), device) == dict.fromkeys(FULL_SAMPLE)


# --- MIG -----------------------------------------------------------------------------

MIG_A = "MIG-aaaa0000-1111-2222-3333-444455556666"
MIG_B = "MIG-bbbb0000-1111-2222-3333-444455556666"


def mig_node() -> FakeNvml:
    """gpu0: MIG enabled with two MIG devices; gpu1: MIG-capable but disabled."""
    mig_unsupported = {"utilization", "power", "temperature", "clock"}
    slots: list[FakeDevice | None] = [
        FakeDevice(
            uuid=MIG_A,
            name="NVIDIA H200 MIG 3g.71gb",
            mem_used=2 * GIB,
            mem_total=70 * GIB,
            unsupported=mig_unsupported,
        ),
        FakeDevice(
            uuid=MIG_B,
            name=b"NVIDIA H200 MIG 3g.71gb",
            mem_used=GIB // 2,
            mem_total=70 * GIB,
            unsupported=mig_unsupported,
        ),
    ]
    parent = FakeDevice(uuid=UUIDS[0], mig_mode=1, mig_slots=slots, unsupported={"utilization"})
    other = FakeDevice(uuid=UUIDS[1], mig_mode=0)
    return FakeNvml([parent, other])


def test_mig_enabled_gpu_exposes_its_mig_devices_instead_of_itself():
    nvml = mig_node()
    devices = visible_gpus(nvml, None)
    assert devices == [
        GpuDevice("gpu0-mig0", 0, MIG_A, "NVIDIA H200 MIG 3g.71gb", True, None),
        GpuDevice("gpu0-mig1", 0, MIG_B, "NVIDIA H200 MIG 3g.71gb", True, None),
        GpuDevice("gpu1", 1, UUIDS[1], "NVIDIA H200", False, None),
    ]
    parent = nvml.devices[0]
    assert devices[0].handle is parent.mig_slots[0]
    assert devices[1].handle is parent.mig_slots[1]
    assert devices[2].handle is nvml.devices[1]


def test_mig_device_sample_has_none_where_nvml_does_not_support_it():
    nvml = mig_node()
    mig0, mig1, _ = visible_gpus(nvml, None)
    assert gpu_sample(nvml, mig0.handle) == {
        "utilization": None,
        "memory_used_mb": 2048.0,
        "memory_total_mb": 71680.0,
        "power_w": None,
        "temperature_c": None,
        "sm_clock_mhz": None,
    }
    assert gpu_sample(nvml, mig1.handle)["memory_used_mb"] == 512.0


def test_mig_label_is_the_nvml_mig_index_and_empty_slots_are_skipped():
    nvml = mig_node()
    parent = nvml.devices[0]
    parent.mig_slots = [parent.mig_slots[0], None, parent.mig_slots[1]]
    assert labels(visible_gpus(nvml, None)) == ["gpu0-mig0", "gpu0-mig2", "gpu1"]


def test_cuda_visible_devices_by_mig_uuid_and_prefix():
    nvml = mig_node()
    assert labels(visible_gpus(nvml, MIG_B)) == ["gpu0-mig1"]
    assert labels(visible_gpus(nvml, "MIG-bbbb,MIG-aaaa")) == ["gpu0-mig1", "gpu0-mig0"]
    assert labels(visible_gpus(nvml, "MIG-a,MIG-ffff,MIG-b")) == ["gpu0-mig0"]


def test_mig_enabled_gpu_named_by_index_stands_for_its_mig_devices():
    assert labels(visible_gpus(mig_node(), "1,0")) == ["gpu1", "gpu0-mig0", "gpu0-mig1"]


# --- CUDA_VISIBLE_DEVICES ------------------------------------------------------------


def test_unset_gives_every_gpu_in_nvml_order_with_decoded_names():
    nvml = three_gpus()
    nvml.devices[1].name = b"NVIDIA A100-SXM4-80GB"
    nvml.devices[2].uuid = UUIDS[2].encode()
    nvml.devices[2].unsupported = {"name"}
    assert visible_gpus(nvml, None) == [
        GpuDevice("gpu0", 0, UUIDS[0], "NVIDIA H200", False, None),
        GpuDevice("gpu1", 1, UUIDS[1], "NVIDIA A100-SXM4-80GB", False, None),
        GpuDevice("gpu2", 2, UUIDS[2], "", False, None),
    ]


def test_subset_by_index_keeps_cuda_order():
    nvml = three_gpus()
    devices = visible_gpus(nvml, "2,0")
    assert labels(devices) == ["gpu2", "gpu0"]
    assert [d.index for d in devices] == [2, 0]
    assert [d.uuid for d in devices] == [UUIDS[2], UUIDS[0]]
    assert devices[0].handle is nvml.devices[2]
    assert devices[1].handle is nvml.devices[0]
    assert labels(visible_gpus(nvml, " 1 , 2 ")) == ["gpu1", "gpu2"]


def test_subset_by_full_uuid_and_unique_prefix():
    nvml = three_gpus()
    assert labels(visible_gpus(nvml, f"{UUIDS[1]},{UUIDS[0]}")) == ["gpu1", "gpu0"]
    assert labels(visible_gpus(nvml, "GPU-2c,GPU-0aaa")) == ["gpu2", "gpu0"]


def test_ambiguous_or_unknown_uuid_prefix_stops_the_list():
    nvml = three_gpus()
    assert visible_gpus(nvml, "GPU-") == []  # matches all three: ambiguous
    assert labels(visible_gpus(nvml, "GPU-1b,GPU-9,GPU-0a")) == ["gpu1"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1,7,0", ["gpu1"]),  # 7: no such GPU
        ("0,-1,2", ["gpu0"]),
        ("2,NoDevFiles,0", ["gpu2"]),
        ("1,,0", ["gpu1"]),
        ("0,GPU-1b", ["gpu0"]),  # kind set by the first entry
        ("GPU-1b,0", ["gpu1"]),
    ],
)
def test_invalid_entry_stops_the_list(value, expected):
    assert labels(visible_gpus(three_gpus(), value)) == expected


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", " "])
def test_no_device(value):
    nvml = three_gpus()
    assert visible_gpus(nvml, value) == []
    assert nvml.calls == []  # decided without asking NVML


def test_device_named_twice_gives_no_device():
    assert visible_gpus(three_gpus(), "0,1,0") == []
    assert visible_gpus(three_gpus(), "GPU-0a,GPU-0aaa1111") == []


def test_unreadable_device_is_skipped_not_fatal():
    nvml = three_gpus(unreadable={1})
    assert labels(visible_gpus(nvml, None)) == ["gpu0", "gpu2"]
    assert labels(visible_gpus(nvml, "1,2")) == ["gpu2"]


def test_device_count_failure_gives_no_device():
    nvml = three_gpus()

    def count() -> int:
        raise NVMLError_Uninitialized()

    nvml.nvmlDeviceGetCount = count  # type: ignore[method-assign]
    assert visible_gpus(nvml, None) == []
    assert visible_gpus(nvml, "0") == []


# --- host ----------------------------------------------------------------------------


def test_host_sample_exact():
    fake_psutil = SimpleNamespace(
        virtual_memory=lambda: SimpleNamespace(total=16 * GIB, available=4 * GIB + 512 * 2**20),
        cpu_percent=lambda interval=None: 37.5,
    )
    assert host_sample(fake_psutil) == {
        "cpu_utilization": 37.5,
        "memory_used_mb": 11776.0,
        "memory_total_mb": 16384.0,
    }


# --- import hygiene ------------------------------------------------------------------


def test_module_imports_without_pynvml_ray_or_mlflow():
    code = textwrap.dedent(
        """
        import sys
        for name in ("pynvml", "ray", "mlflow"):
            sys.modules[name] = None  # any import of them now raises ImportError
        import jupyter_trainfactory.telemetry.system as system
        print(system.init_nvml(None))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "NVML unavailable (the nvidia-ml-py package (module pynvml) is not installed): " + FALLBACK
    )
