"""A second launch of a function whose job still runs names that job, and a kernel that
restarted finds the user's only running job (issue 14, item 9; the rest of its frictions are
unit tests in tests/unit/test_frictions.py)."""

import time
import uuid

import cloudpickle
import pytest
import train_fns
from conftest import ipython_shell
from IPython.core.error import UsageError

from jupyter_trainfactory.jobs import TERMINAL_STATES
from jupyter_trainfactory.magics import TrainMagics

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/


@pytest.fixture(scope="module")
def ip():
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_trainfactory")
    return shell


@pytest.mark.job
@pytest.mark.timeout(240)
def test_restarted_kernel_finds_the_running_job_and_relaunch_names_it(ip, manager, capsys):
    name = f"friction-{uuid.uuid4().hex[:8]}"
    ip.user_ns["long_loop"] = train_fns.long_loop
    magics = ip.magics_manager.registry["TrainMagics"]
    job = ip.run_line_magic(
        "train", f"launch long_loop --workers 1 --run-name {name} --experiment tests"
    )
    try:
        assert "Still running" not in capsys.readouterr().out  # no other job of this name
        deadline = time.monotonic() + 180
        while job.info().state != "RUNNING":
            assert time.monotonic() < deadline, job.info()
            time.sleep(0.5)
        # A second launch of the same cell names this job (from the real listing).
        note = TrainMagics._still_running(manager, "tf-00000000", name)
        assert job.id in note and f"stop it with %train stop {job.id}." in note
        # After a restart a bare subcommand takes the user's only running job, or asks.
        fresh = TrainMagics(shell=ip)
        live = [j.job_id for j in manager.list() if j.state not in TERMINAL_STATES]
        if live == [job.id]:
            fresh.train("status")
            out = capsys.readouterr().out
            assert out.startswith(f"No job launched from this kernel yet: using {job.id} (")
            assert f"job: {job.id}" in out
            fresh.train("stop --now")  # the picked job is now this kernel's last one
            assert f"{job.id}: STOPPED" in capsys.readouterr().out
        else:
            with pytest.raises(UsageError, match=f"of yours are running: .*{job.id}"):
                fresh.train("status")
    finally:
        for board in list(getattr(magics, "_dashboards", {}).values()):
            board.close()
        if job.status() not in TERMINAL_STATES:
            job.stop(now=True)
