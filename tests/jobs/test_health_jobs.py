"""``trainfactory.health()`` on the embedded cluster: one CPU node, NVML unavailable here,
so its GPU checks say so (neither ok nor fail), its host checks pass, it is healthy."""

import time

import pytest

from jupyter_trainfactory import health
from jupyter_trainfactory.nodehealth.check import NA, NOT_AVAILABLE, OK

pytestmark = pytest.mark.job


@pytest.mark.timeout(180)
def test_health_of_the_embedded_cpu_node(manager):
    started = time.monotonic()
    report = health(timeout=20.0)
    took = time.monotonic() - started
    text = report.text()
    assert len(report.nodes) == 1, text
    node = report.nodes[0]
    assert node.node_id == manager.cluster(settle_s=5.0).nodes[0].node_id
    checks = {(scope, c.name): c for scope, c in node.checks}
    for name in ("nvml", "driver", "gpu_count", "gpu_model", "driver_consistency"):
        check = checks[("node", name)]
        assert check.status == NA and NOT_AVAILABLE in check.detail, text
    for name in ("memory", "temp_disk", "storage_disk", "cpus"):
        assert checks[("host", name)].status == OK, text
    assert checks[("node", "cpus_advertised")].status == OK, text
    assert node.healthy and report.healthy, text
    assert f"{node.label}: healthy" in text
    print(f"health took {took:.1f} s\n{text}")


@pytest.mark.timeout(240)
def test_a_preflight_launch_checks_the_nodes_then_submits(manager, mlflow_client):
    from jupyter_trainfactory import launch
    from tests import train_fns

    job = launch(
        train_fns.fault_loop,
        workers=1,
        config={"steps": 2, "every": 1, "fail_step": -1, "marker": ""},
        experiment="tests",
        preflight=True,
    )
    assert job.wait(timeout=180) == "SUCCEEDED"
    assert mlflow_client.get_run(job.run_id).data.params["preflight"] == "true"
