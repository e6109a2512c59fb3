"""Starting and stopping the embedded services' processes, without starting them: the Ray
head's command line, a start failure's sentence, and a stop that ends what a service left
behind (the services themselves: tests/jobs/test_services.py)."""

import contextlib
import subprocess
import sys
import time

import psutil
import pytest

from jupyter_trainfactory import services as svc

#: A "service" whose child ignores SIGTERM and outlives it, as Ray's RuntimeEnvAgent does.
_SERVICE_WITH_A_STUBBORN_CHILD = """
import subprocess, sys, time
child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child])
time.sleep(600)
"""


@pytest.fixture
def _no_temp_dir(monkeypatch, tmp_path):
    """The argv tests create no Ray temp directory under /tmp."""
    monkeypatch.setattr(svc, "_ray_temp_dir", lambda home: tmp_path / "ray")


def _head_argv(tmp_path, **environ):
    ports = {"--metrics-export-port": 6005}
    return svc._ray_head_argv(tmp_path, 6001, 6002, ports, environ)


def test_stop_ends_what_the_service_left_behind():
    parent = subprocess.Popen([sys.executable, "-c", _SERVICE_WITH_A_STUBBORN_CHILD])
    deadline = time.monotonic() + 30
    while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
        time.sleep(0.1)
    (child,) = psutil.Process(parent.pid).children()
    try:
        started = psutil.Process(parent.pid).create_time()
        assert svc._terminate(svc.ServiceProcess("ray", parent.pid, started, "", "")) is True
        parent.wait(timeout=10)
        assert not child.is_running()
    finally:  # a failed check leaves neither behind
        parent.kill()  # a no-op once it has exited
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


@pytest.mark.usefixtures("_no_temp_dir")
def test_ray_head_argv_sizes_the_head_from_the_environment(tmp_path):
    plain = _head_argv(tmp_path)
    assert plain[1:4] == ["start", "--head", "--block"]
    assert "--port=6001" in plain and "--metrics-export-port=6005" in plain
    assert not [a for a in plain if a.startswith(("--num-cpus", "--object-store-memory"))]
    assert (
        _head_argv(tmp_path, TRAINFACTORY_RAY_NUM_CPUS="", TRAINFACTORY_RAY_OBJECT_STORE_MB=" ")
        == plain
    )
    sized = _head_argv(
        tmp_path, TRAINFACTORY_RAY_NUM_CPUS="1", TRAINFACTORY_RAY_OBJECT_STORE_MB=" 300 "
    )
    assert sized == plain + ["--num-cpus=1", f"--object-store-memory={300 * 1024 * 1024}"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TRAINFACTORY_RAY_NUM_CPUS", "two"),
        ("TRAINFACTORY_RAY_NUM_CPUS", "0"),
        ("TRAINFACTORY_RAY_NUM_CPUS", "1.5"),
        ("TRAINFACTORY_RAY_OBJECT_STORE_MB", "74"),
        ("TRAINFACTORY_RAY_OBJECT_STORE_MB", "300MB"),
    ],
)
@pytest.mark.usefixtures("_no_temp_dir")
def test_ray_head_argv_refuses_a_bad_size_in_one_sentence(tmp_path, name, value):
    with pytest.raises(svc.ServiceError) as err:
        _head_argv(tmp_path, **{name: value})
    message = str(err.value)
    assert message.startswith(f"{name} must be a whole number") and repr(value) in message
    assert message.endswith(").") and "\n" not in message


def test_a_start_failure_is_one_sentence_that_names_the_log(tmp_path):
    from jupyter_trainfactory.sentences import first_line

    log = tmp_path / "ray-head.log"
    log.write_text(
        "starting\n" + "x " * 200 + "\nRuntimeError: node timed out during startup\nbye\n"
    )
    assert svc._log_error(str(log)) == "RuntimeError: node timed out during startup"
    cut = first_line("Make sure dependencies are installed with `pip install ray[default]` " * 5)
    assert len(cut) <= 200 and cut.endswith("…") and not cut.endswith("ray[…")
    assert first_line(ValueError()) == "ValueError"
