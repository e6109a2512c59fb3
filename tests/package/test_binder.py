"""binder/: the steps Binder runs, checked here against the wheel ``make test`` built.

A fresh virtual environment sees the project's installed dependencies through one ``.pth``
line (the directory only: the ``.pth`` files in it, the editable install's among them, are
not processed), and ``binder/postBuild`` itself installs the wheel into it with
``--no-deps``. No labextension is built and no Ray is started. Binder itself (repo2docker,
conda-forge, PyTorch's index) is not exercised.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from jupyter_trainfactory import services as svc

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
SHARED = Path(sysconfig.get_path("purelib"))  # the project's environment, dependencies installed

pytestmark = pytest.mark.timeout(300)


def _wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("jupyter_trainfactory-*-py3-none-any.whl"))
    if len(wheels) != 1:
        pytest.fail(
            f"Expected one jupyter_trainfactory wheel in {ROOT / 'dist'}, found {len(wheels)}: "
            "run `make test` (or `make dist/jupyter_trainfactory-0.1.0-py3-none-any.whl`) first."
        )
    return wheels[0]


def _package_entries() -> set[str]:
    return {p.name for p in SHARED.iterdir() if "jupyter_trainfactory" in p.name}


def _run(argv, env, cwd, timeout=180) -> str:
    proc = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # Jupyter's colours
    assert proc.returncode == 0, f"{argv} exited with {proc.returncode}:\n{output}"
    return output


class BinderEnv:
    def __init__(self, root: Path):
        self.root = root
        self.venv = root / "venv"
        self.home = root / "home"
        self.python = self.venv / "bin" / "python"
        self.env: dict[str, str] = {}

    def python_out(self, *args: str) -> str:
        """Run the environment's Python outside the source tree (so no ``''`` finds it)."""
        return _run([str(self.python), *args], self.env, self.home)


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory) -> BinderEnv:
    wheel = _wheel()
    env = BinderEnv(tmp_path_factory.mktemp("binder"))
    env.home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env.venv)], check=True)
    site = subprocess.run(
        [str(env.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_trainfactory_shared_deps.pth").write_text(f"{SHARED}\n")
    drop = ("TRAINFACTORY_", "JUPYTER_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONUSER")
    env.env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.env.update(
        HOME=str(env.home),
        PATH=f"{env.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(env.venv),
        PYTHONNOUSERSITE="1",
        TRAINFACTORY_WHEEL=str(wheel),
    )
    before = _package_entries()
    # Binder runs postBuild from the repository root.
    _run([str(BINDER / "postBuild")], env.env, ROOT)
    assert _package_entries() == before, "postBuild changed the project's own environment"
    del env.env["TRAINFACTORY_WHEEL"]
    return env


def test_post_build_installs_the_wheel_into_the_fresh_environment(binder_env):
    out = binder_env.python_out(
        "-c",
        "import jupyter_trainfactory, jupyter_trainfactory.server, ray, importlib.metadata as md;"
        "print(jupyter_trainfactory.__file__); print(ray.__file__);"
        "print(md.distribution('jupyter_trainfactory').read_text('direct_url.json'))",
    )
    package, ray_file, direct_url = out.splitlines()[:3]
    assert Path(package).is_relative_to(binder_env.venv), package  # the wheel, not the source
    assert Path(ray_file).is_relative_to(SHARED), ray_file  # dependencies are reused
    assert "jupyter_trainfactory-" in direct_url and ".whl" in direct_url
    assert (binder_env.venv / "bin" / "jupyter-trainfactory").exists()


def test_the_side_panel_is_installed_and_enabled(binder_env):
    labext = binder_env.venv / "share/jupyter/labextensions/jupyter-trainfactory"
    assert (labext / "package.json").is_file()
    assert list((labext / "static").glob("remoteEntry.*.js"))
    out = binder_env.python_out("-m", "jupyterlab.labextensions", "list")
    section = re.escape(str(labext.parent))
    assert re.search(section + r"\s*\n\s+jupyter-trainfactory v\S+ enabled\s+OK", out), out


def test_the_server_extension_is_enabled(binder_env):
    out = binder_env.python_out("-m", "jupyter_server", "extension", "list")
    config = re.escape(str(binder_env.venv / "etc" / "jupyter"))
    assert re.search(
        config + r"\s*\n\s+jupyter_trainfactory\.server enabled\s*\n"
        r"\s+- Validating jupyter_trainfactory\.server\.\.\.\s*\n"
        r"\s+jupyter_trainfactory\.server\s+(\S+\s+)?OK",
        out,
    ), out
    assert (binder_env.home / ".trainfactory").is_dir()


def test_start_sizes_ray_for_binder(binder_env, tmp_path, monkeypatch):
    monkeypatch.setattr(svc, "_ray_temp_dir", lambda home: tmp_path / "ray")
    out = _run([str(BINDER / "start"), "env"], binder_env.env, tmp_path)
    values = dict(
        line.split("=", 1) for line in out.splitlines() if line.startswith("TRAINFACTORY_")
    )
    assert values == {
        "TRAINFACTORY_HOME": f"{binder_env.home}/.trainfactory",
        "TRAINFACTORY_RAY_NUM_CPUS": "1",
        "TRAINFACTORY_RAY_OBJECT_STORE_MB": "300",
        "TRAINFACTORY_EXAMPLE_WORKERS": "1",
    }
    argv = svc._ray_head_argv(tmp_path, 1, 2, {}, values)  # what the Ray head would get
    assert argv[-2:] == ["--num-cpus=1", f"--object-store-memory={300 * 2**20}"]
    failing = subprocess.run(
        [str(BINDER / "start"), "sh", "-c", "exit 3"], env=binder_env.env, check=False
    )
    assert failing.returncode == 3  # exec: the session's command is the process


def test_environment_pins_the_cpu_torch_the_makefile_uses():
    assert not (BINDER / "requirements.txt").exists()  # repo2docker reads one of the two
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)
    spec = yaml.safe_load((BINDER / "environment.yml").read_text())
    assert spec["channels"] == ["conda-forge"]
    conda = [d for d in spec["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in conda and "nodejs=20" in conda and "pip" in conda
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip
    makefile_torch = re.search(r"pip install --quiet (torch==\S+)", (ROOT / "Makefile").read_text())
    assert makefile_torch, "the Makefile no longer pins torch"
    assert f"{makefile_torch.group(1)}+cpu" in pip
