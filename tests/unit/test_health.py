"""Node health checks (``jupyter_trainfactory.nodehealth``) against a fake NVML that returns
each failing field and a device without the fields, the host checks on this machine's
real psutil, and the cross-node report on recorded results."""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil
import pytest

from jupyter_trainfactory.cluster import ClusterInfo, Node
from jupyter_trainfactory.nodehealth.check import FAIL, NA, NOT_AVAILABLE, OK, Check
from jupyter_trainfactory.nodehealth.gpu import gpu_checks
from jupyter_trainfactory.nodehealth.host import host_checks
from jupyter_trainfactory.nodehealth.node import MARKER, parse_output
from jupyter_trainfactory.nodehealth.report import build_report

# --- fake pynvml: nvidia-ml-py's names, constants and error classes -------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


@dataclass(eq=False)
class Gpu:
    uuid: str
    name: str = "NVIDIA H200"
    ecc_uncorrected: int = 0
    remap: tuple = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    retired_pending: int = 0
    clocks_event: int = 0
    pcie: tuple = (16, 5, 16, 5)  # current width, gen, max width, gen
    unsupported: set[str] = field(default_factory=set)  # readings that raise NotSupported
    lost: set[str] = field(default_factory=set)  # readings that raise GpuIsLost


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_ENABLED = 1
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwSlowdown = 0x8
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40

    def __init__(self, gpus, driver="550.54.15", init_error=None, missing=()):
        self.gpus, self.driver, self.init_error = gpus, driver, init_error
        self.missing = set(missing)  # functions this "nvidia-ml-py" lacks

    def __getattribute__(self, name):
        if name != "missing" and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def _read(self, h: Gpu, what: str):
        if what in h.unsupported:
            raise NVMLError_NotSupported()
        if what in h.lost:
            raise NVMLError_GpuIsLost()

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetName(self, h):
        return h.name

    def nvmlDeviceGetMigMode(self, h):
        raise NVMLError_NotSupported()

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self._read(h, "ecc")
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return h.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h):
        self._read(h, "remap")
        return h.remap

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        self._read(h, "retired")
        return h.retired_pending

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._read(h, "clocks")
        return h.clocks_event

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        self._read(h, "clocks")
        return h.clocks_event

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        self._read(h, "pcie")
        return h.pcie[0]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        self._read(h, "pcie")
        return h.pcie[1]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        self._read(h, "pcie")
        return h.pcie[2]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        self._read(h, "pcie")
        return h.pcie[3]


def _checks(nvml) -> dict[str, Check]:
    """name -> Check of the first GPU."""
    found = gpu_checks(nvml)
    return {c["name"]: Check.from_dict(c) for c in found["gpus"][0]["checks"]}


# --- one GPU's checks ------------------------------------------------------------------


def test_a_healthy_gpu_passes_every_check_with_its_measured_values():
    found = gpu_checks(FakeNvml([Gpu("GPU-a")]))
    assert found["nvml"]["status"] == OK and found["gpu_count"] == 1
    assert found["driver"] == "550.54.15" and found["driver_check"]["status"] == OK
    checks = _checks(FakeNvml([Gpu("GPU-a")]))
    assert [c.name for c in checks.values()] == [
        "model",
        "ecc_uncorrected",
        "row_remap",
        "throttle",
        "pcie_link",
    ]
    assert all(c.status == OK for c in checks.values()), checks
    assert checks["pcie_link"].detail == "PCIe gen5 x16 of gen5 x16."
    assert checks["ecc_uncorrected"].detail.startswith("0 uncorrected")


@pytest.mark.parametrize(
    ("gpu", "name", "words"),
    [
        (Gpu("GPU-a", ecc_uncorrected=3), "ecc_uncorrected", "3 uncorrected ECC errors"),
        (Gpu("GPU-a", remap=(2, 1, 1, 0)), "row_remap", "remap pending yes"),
        (Gpu("GPU-a", remap=(0, 5, 0, 1)), "row_remap", "remap failure yes"),
        (Gpu("GPU-a", clocks_event=0x40 | 0x1), "throttle", "HW thermal slowdown"),
        (Gpu("GPU-a", clocks_event=0x20), "throttle", "SW thermal slowdown"),
        (Gpu("GPU-a", clocks_event=0x80), "throttle", "HW power brake"),
        (Gpu("GPU-a", clocks_event=0x8), "throttle", "HW slowdown"),
        (Gpu("GPU-a", pcie=(8, 5, 16, 5)), "pcie_link", "PCIe gen5 x8 of gen5 x16"),
        (Gpu("GPU-a", pcie=(16, 3, 16, 5)), "pcie_link", "gen3 x16 of gen5 x16"),
        (Gpu("GPU-a", lost={"ecc"}), "ecc_uncorrected", "NVMLError_GpuIsLost"),
    ],
)
def test_each_failing_field_fails_its_check_with_the_value(gpu, name, words):
    check = _checks(FakeNvml([gpu]))[name]
    assert check.status == FAIL, check
    assert words in check.detail


def test_pcie_below_max_says_an_idle_gpu_may_downshift():
    check = _checks(FakeNvml([Gpu("GPU-a", pcie=(8, 5, 16, 5))]))["pcie_link"]
    assert "idle GPU may downshift" in check.detail and "NVML" in check.detail


def test_idle_and_power_cap_reasons_do_not_fail():
    check = _checks(FakeNvml([Gpu("GPU-a", clocks_event=0x1 | 0x4)]))["throttle"]
    assert check.status == OK and "0x5" in check.detail


def test_older_nvml_reads_the_throttle_reasons_under_their_old_name():
    nvml = FakeNvml(
        [Gpu("GPU-a", clocks_event=0x40)], missing={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    check = _checks(nvml)["throttle"]
    assert check.status == FAIL and "HW thermal slowdown" in check.detail


def test_retired_pages_are_checked_where_row_remapping_is_not_supported():
    gpu = Gpu("GPU-a", unsupported={"remap"}, retired_pending=1)
    checks = _checks(FakeNvml([gpu]))
    assert "row_remap" not in checks
    assert checks["retired_pages"].status == FAIL
    gpu.retired_pending = 0
    assert _checks(FakeNvml([gpu]))["retired_pages"].status == OK


def test_a_device_without_the_fields_says_not_available_never_ok():
    gpu = Gpu("GPU-a", name="", unsupported={"ecc", "remap", "retired", "clocks", "pcie"})
    checks = _checks(FakeNvml([gpu]))
    assert set(checks) == {"model", "ecc_uncorrected", "retired_pages", "throttle", "pcie_link"}
    for check in checks.values():
        assert check.status == NA, check
        assert NOT_AVAILABLE in check.detail


def test_functions_missing_from_nvidia_ml_py_say_not_available_never_ok():
    missing = {
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlSystemGetDriverVersion",
    }
    found = gpu_checks(FakeNvml([Gpu("GPU-a")], missing=missing))
    assert found["driver"] is None and found["driver_check"]["status"] == NA
    checks = {c["name"]: c for c in found["gpus"][0]["checks"]}
    assert checks["model"]["status"] == OK
    for name in ("ecc_uncorrected", "retired_pages", "throttle", "pcie_link"):
        assert checks[name]["status"] == NA and NOT_AVAILABLE in checks[name]["detail"]


def test_no_nvml_makes_the_gpu_checks_not_available():
    for nvml in (None, FakeNvml([], init_error=NVMLError_LibraryNotFound())):
        found = gpu_checks(nvml)
        assert found["nvml"]["status"] == NA
        assert NOT_AVAILABLE in found["nvml"]["detail"]
        assert found["gpu_count"] is None and found["gpus"] == []


def test_the_constants_the_checks_use_exist_in_the_installed_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    from jupyter_trainfactory.nodehealth.gpu import THROTTLE_FAILS

    for name in THROTTLE_FAILS:
        assert isinstance(getattr(pynvml, "nvmlClocksEventReason" + name), int)
        assert isinstance(getattr(pynvml, "nvmlClocksThrottleReason" + name), int)
    for name in ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"):
        assert isinstance(getattr(pynvml, name), int)
    for fn in (
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlSystemGetDriverVersion",
    ):
        assert callable(getattr(pynvml, fn))


# --- host checks on this machine ---------------------------------------------------------


def test_host_checks_pass_on_this_machine(tmp_path):
    checks = {c.name: c for c in host_checks(psutil, str(tmp_path), str(tmp_path / "storage"))}
    assert list(checks) == ["memory", "temp_disk", "storage_disk", "cpus"]
    assert all(c.status == OK for c in checks.values()), checks
    assert "GB free in" in checks["temp_disk"].detail
    assert checks["cpus"].detail.startswith(f"{psutil.cpu_count()} logical CPUs")


def test_remote_storage_and_no_psutil_are_not_available():
    storage = host_checks(psutil, None, "s3://bucket/jobs")
    assert {c.name: c.status for c in storage}["storage_disk"] == NA
    assert {c.name: c.status for c in storage}["temp_disk"] == NA
    assert all(c.status == NA for c in host_checks(None, "/tmp", "/tmp"))


# --- the report across nodes --------------------------------------------------------------


def _node_result(node_id, host, nvml, cpus=8):
    return {
        "node_id": node_id,
        "host": host,
        "hostname": host,
        "gpu": gpu_checks(nvml),
        "host_checks": [
            {"name": "memory", "status": OK, "detail": "100.0 GB of 200.0 GB memory available."},
            {"name": "cpus", "status": OK, "detail": f"{cpus} logical CPUs (4 cores)."},
        ],
    }


def _cluster(*nodes):
    return ClusterInfo("http://head:8265", "2.50.0", "3.11.9", list(nodes))


def _gpu_node(node_id, host, gpus=2, kind="H200"):
    resources = {"CPU": 8.0, "GPU": float(gpus), f"accelerator_type:{kind}": 1.0}
    return Node(node_id, host, resources)


def test_mismatched_driver_across_two_nodes_fails_both_named():
    a = _node_result("a" * 16, "10.0.0.1", FakeNvml([Gpu("GPU-a"), Gpu("GPU-b")]))
    b = _node_result("b" * 16, "10.0.0.2", FakeNvml([Gpu("GPU-c"), Gpu("GPU-d")], driver="535.1"))
    report = build_report(
        _cluster(_gpu_node("a" * 16, "10.0.0.1"), _gpu_node("b" * 16, "10.0.0.2")),
        {"nodes": [a, b], "missing": {}},
    )
    assert not report.healthy and len(report.unhealthy) == 2  # a tie: neither is the norm
    reasons = report.unhealthy[0].reasons
    assert any("driver_consistency" in r and "535.1 on 1" in r for r in reasons), reasons
    text = report.text()
    assert "aaaaaaaa 10.0.0.1: UNHEALTHY" in text and "bbbbbbbb 10.0.0.2: UNHEALTHY" in text


def test_the_odd_driver_out_of_three_fails_only_its_node():
    results = [
        _node_result(i * 16, f"10.0.0.{n}", FakeNvml([Gpu("GPU-x"), Gpu("GPU-y")], driver=d))
        for n, (i, d) in enumerate([("a", "550"), ("b", "550"), ("c", "535")])
    ]
    cluster = _cluster(*(_gpu_node(i * 16, f"10.0.0.{n}") for n, i in enumerate("abc")))
    report = build_report(cluster, {"nodes": results, "missing": {}})
    assert [n.node_id[0] for n in report.unhealthy] == ["c"]


def test_gpu_count_and_model_are_checked_against_what_ray_advertises():
    result = _node_result(
        "a" * 16, "10.0.0.1", FakeNvml([Gpu("GPU-a", name="NVIDIA H100 80GB HBM3")])
    )
    report = build_report(
        _cluster(_gpu_node("a" * 16, "10.0.0.1", gpus=2, kind="H200")),
        {"nodes": [result], "missing": {}},
    )
    checks = {c.name: c for _, c in report.nodes[0].checks}
    assert (
        checks["gpu_count"].status == FAIL
        and "NVML sees 1 GPUs, Ray advertises 2" in checks["gpu_count"].detail
    )
    assert checks["gpu_model"].status == FAIL and "H100" in checks["gpu_model"].detail
    good = build_report(
        _cluster(_gpu_node("a" * 16, "10.0.0.1", gpus=1, kind="H100")),
        {"nodes": [result], "missing": {}},
    )
    assert good.healthy, good.text()


def test_a_cpu_node_is_healthy_with_its_gpu_checks_not_available():
    result = _node_result("c" * 16, "10.0.0.3", None)
    report = build_report(_cluster(Node("c" * 16, "10.0.0.3", {"CPU": 2.0})), {"nodes": [result]})
    assert report.healthy, report.text()
    statuses = {c.name: c.status for _, c in report.nodes[0].checks}
    for name in ("nvml", "driver", "gpu_count", "gpu_model", "driver_consistency"):
        assert statuses[name] == NA
    assert statuses["cpus_advertised"] == OK and statuses["memory"] == OK
    assert "cccccccc 10.0.0.3: healthy" in report.text()


def test_a_node_that_advertises_gpus_nvml_cannot_read_is_unhealthy():
    result = _node_result("a" * 16, "10.0.0.1", None)
    report = build_report(_cluster(_gpu_node("a" * 16, "10.0.0.1")), {"nodes": [result]})
    assert not report.healthy
    assert any(
        "Ray advertises 2 GPUs but NVML is not readable" in r for r in report.nodes[0].reasons
    )


def test_a_node_whose_check_did_not_finish_is_named_unhealthy():
    report = build_report(
        _cluster(Node("d" * 16, "10.0.0.4", {"CPU": 2.0})),
        {"nodes": [], "missing": {"d" * 16: "its check did not finish in 30 s"}},
    )
    assert report.unhealthy[0].reasons == ["node reachable: its check did not finish in 30 s."]


def test_the_table_has_one_row_per_node_per_check():
    a = _node_result("a" * 16, "10.0.0.1", FakeNvml([Gpu("GPU-a", ecc_uncorrected=1)]))
    report = build_report(_cluster(_gpu_node("a" * 16, "10.0.0.1", gpus=1)), {"nodes": [a]})
    rows = report.rows()
    assert len(rows) == len(report.nodes[0].checks)
    assert {"node", "scope", "check", "status", "detail"} == set(rows[0])
    assert report.text().splitlines()[1].split() == ["NODE", "SCOPE", "CHECK", "STATUS", "DETAIL"]
    assert any(
        r["scope"] == "gpu0" and r["check"] == "ecc_uncorrected" and r["status"] == FAIL
        for r in rows
    )
    assert report.to_dict()["nodes"][0]["healthy"] is False


def test_the_job_result_is_read_from_its_log():
    logs = "some ray chatter\n" + MARKER + '{"nodes": [], "missing": {}}\nbye\n'
    assert parse_output(logs) == {"nodes": [], "missing": {}}
    assert parse_output("no result") is None


def test_every_door_has_health():
    import jupyter_trainfactory
    from jupyter_trainfactory.arguments import parse

    ns = parse("health --address http://head:8265 --timeout 5")
    assert (ns.command, ns.address, ns.timeout, ns.storage) == (
        "health",
        "http://head:8265",
        5.0,
        None,
    )
    from jupyter_trainfactory import api

    assert jupyter_trainfactory.health is api.health  # the package (nodehealth) does not shadow it
    from jupyter_trainfactory import cli, magics

    assert "health" in cli._COMMANDS and hasattr(magics.TrainMagics, "_cmd_health")


def test_the_cli_help_of_health_names_its_options(capsys):
    from jupyter_trainfactory import cli

    assert cli.main(["help", "health"]) == 0
    out = capsys.readouterr().out
    assert "--address" in out and "--storage" in out and "--timeout" in out


def test_preflight_refuses_only_for_a_node_the_job_may_use():
    from jupyter_trainfactory.nodehealth.preflight import refusal

    results = [
        _node_result(i * 16, f"10.0.0.{n}", FakeNvml([Gpu("GPU-x"), Gpu("GPU-y")], driver=d))
        for n, (i, d) in enumerate([("a", "550"), ("b", "550"), ("c", "535")])
    ]
    cluster = _cluster(*(_gpu_node(i * 16, f"10.0.0.{n}") for n, i in enumerate("abc")))
    report = build_report(cluster, {"nodes": results, "missing": {}})
    assert refusal(report, ["a" * 16, "b" * 16]) is None  # the job's nodes are healthy
    sentence = refusal(report, ["a" * 16, "c" * 16])
    assert sentence.startswith("Preflight: node cccccccc 10.0.0.2 failed node driver_consistency")
    assert sentence.endswith("not launched (`%train health` shows every check).")
    assert sentence.count(".") >= 1 and "\n" not in sentence
    ecc = _node_result("d" * 16, "10.0.0.4", FakeNvml([Gpu("GPU-a", ecc_uncorrected=1)]))
    lost = {"nodes": [ecc], "missing": {"e" * 16: "its check did not finish in 30 s"}}
    two = build_report(
        _cluster(_gpu_node("d" * 16, "10.0.0.4", gpus=1), Node("e" * 16, "10.0.0.5", {"CPU": 2.0})),
        lost,
    )
    assert "and 1 more node(s); not launched" in refusal(two, ["d" * 16, "e" * 16])


def test_avoid_unhealthy_adds_a_node_id_exclusion_to_every_worker():
    from jupyter_trainfactory.nodehealth.preflight import away_from
    from jupyter_trainfactory.spec import SpecError

    assert away_from(None, ["b", "a"]) == {"ray.io/node-id": "!in(a,b)"}
    assert away_from({"tf-node": "x"}, ["a"]) == {"tf-node": "x", "ray.io/node-id": "!in(a)"}
    per_worker = away_from([{"zone": "1"}, {}], ["a"])
    assert per_worker == [{"zone": "1", "ray.io/node-id": "!in(a)"}, {"ray.io/node-id": "!in(a)"}]
    with pytest.raises(SpecError, match="already has one"):
        away_from({"ray.io/node-id": "abc"}, ["a"])
