"""A job outlives the notebook kernel that launched it: a real kernel (nbclient) is
restarted while its job runs, and the new kernel attaches and sees the whole history."""

import time
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbclient.util import run_sync
from nbformat.v4 import new_code_cell, new_notebook

TESTS = Path(__file__).parents[1]
STEPS = 200


def _output(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.job
@pytest.mark.timeout(420)
def test_a_restarted_kernel_attaches_and_sees_the_job_finish(manager, mlflow_client, tmp_path):
    setup = f"""
%load_ext jupyter_trainfactory
import sys
sys.path.insert(0, {str(TESTS)!r})
import cloudpickle, train_fns
cloudpickle.register_pickle_by_value(train_fns)
fault_loop = train_fns.fault_loop
config = {{"steps": {STEPS}, "every": 20, "fail_step": -1, "marker": {str(tmp_path / "m")!r}}}
"""
    launch = "job = %train launch fault_loop --workers 2 --config config\nprint('JOB', job.id)"
    nb = new_notebook(cells=[new_code_cell(setup), new_code_cell(launch)])
    client = NotebookClient(nb, timeout=300, kernel_name="python3")
    with client.setup_kernel():
        client.execute_cell(nb.cells[0], 0)
        client.execute_cell(nb.cells[1], 1)
        job_id = _output(nb.cells[1]).split("JOB ")[1].split()[0]
        run_id = manager.info(job_id).run_id
        deadline = time.monotonic() + 180
        while "loss" not in mlflow_client.get_run(run_id).data.metrics:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)

        run_sync(client.km.restart_kernel)(now=True)
        run_sync(client.kc.wait_for_ready)(timeout=60)
        assert manager.info(job_id).state == "RUNNING"  # the job outlived its kernel
        at_restart = manager.info(job_id).step or 0

        # `%train attach` shows the live dashboard; `attach()` gives the handle. A new
        # dashboard after the end reads the whole history back.
        attach = f"""
%load_ext jupyter_trainfactory
from jupyter_trainfactory import attach
from jupyter_trainfactory.dashboard import JobDashboard
%train attach {job_id}
job = attach({job_id!r})
live = job.dashboard()
state = job.wait(timeout=240)
loss = JobDashboard(job, start=False).model.series["loss"]
print("STATE", state, "POINTS", len(loss), "FIRST", loss[0][0], "LAST", loss[-1][0])
print("HEADER", live._header.value)
"""
        nb.cells.append(new_code_cell(attach))
        client.execute_cell(nb.cells[2], 2)
    out = _output(nb.cells[2])
    assert f"STATE SUCCEEDED POINTS {STEPS} FIRST 1 LAST {STEPS}" in out, out[-2000:]
    assert "SUCCEEDED" in out.split("HEADER", 1)[1]
    assert at_restart < STEPS  # it was mid-run when the kernel restarted
    assert sorted(p.step for p in mlflow_client.get_metric_history(run_id, "loss")) == list(
        range(1, STEPS + 1)
    )
