"""A real JupyterLab server and the Galata/Playwright run against it (Debian's chromium).

Shared by the browser tests (tests/browser/test_panel_browser.py, tests/browser/test_dashboard_browser.py):
the server is started from the test's virtual environment on a free port, with Galata's
test settings (labextension/ui-tests/jupyter_server_test_config.py), over the same Ray
head and MLflow server as the test session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

UI_TESTS = Path(__file__).resolve().parent.parent / "labextension" / "ui-tests"
#: Where Playwright writes each test's output (screenshots).
RESULTS = UI_TESTS / "test-results"
BIN = Path(sys.executable).parent


def this_trees_panel(root: Path) -> str:
    """A ``JUPYTER_PATH`` whose first ``labextensions`` holds this tree's build of the
    panel: JupyterLab takes the first extension of a name it finds on its path."""
    import jupyter_trainfactory

    built = Path(jupyter_trainfactory.__file__).parent / "labextension"
    assert (built / "package.json").is_file(), "build the panel: `jlpm build` in labextension"
    (root / "labextensions").mkdir(parents=True)
    (root / "labextensions" / "jupyter-trainfactory").symlink_to(built)
    return os.pathsep.join(p for p in (str(root), os.environ.get("JUPYTER_PATH", "")) if p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """Wait until ``url`` answers 200; fail with the server's log when it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"JupyterLab exited: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"JupyterLab did not answer at {url}"
        time.sleep(1)


def browser_env(home: str, root: Path, port: int, **extra: str) -> dict[str, str]:
    """The environment of the server and of Playwright: this session's services, the
    server root ``root``, Debian's chromium and no browser download."""
    return {
        **os.environ,
        "TRAINFACTORY_HOME": home,  # the same services and jobs as this session
        "TF_LAB_PORT": str(port),
        "TARGET_URL": f"http://127.0.0.1:{port}",
        "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        "JUPYTERLAB_GALATA_ROOT_DIR": str(root),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "CI": "1",
        **extra,
    }


@contextlib.contextmanager
def jupyter_lab(env: dict[str, str], log: Path):
    """A JupyterLab server (it serves Notebook 7's pages too) until the block ends."""
    with open(log, "w") as out:
        lab = subprocess.Popen(
            [str(BIN / "jupyter"), "lab", "--config", "jupyter_server_test_config.py"],
            cwd=UI_TESTS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"{env['TARGET_URL']}/lab", lab, 120, log)
            yield lab
        finally:
            lab.terminate()
            try:
                lab.wait(30)
            except subprocess.TimeoutExpired:
                lab.kill()


def playwright(spec: str, env: dict[str, str], timeout: float) -> str:
    """Run one spec of labextension/ui-tests/tests; assert it passed; return its log."""
    ui = subprocess.run(
        [str(BIN / "jlpm"), "playwright", "test", f"tests/{spec}"],
        cwd=UI_TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = (ui.stdout + ui.stderr)[-6000:]
    print(output)  # the browser test's own log
    assert ui.returncode == 0, f"the browser test failed:\n{output}"
    return output


#: Where :func:`screenshots` keeps a copy of each (Playwright empties test-results/ per run).
KEPT = UI_TESTS / "test-results-kept"


def screenshots() -> set[str]:
    """The names of the screenshots the browser tests saved so far; each is also copied
    to :data:`KEPT`, so the shots of every Playwright run of a test stay there to look at."""
    KEPT.mkdir(exist_ok=True)
    names = set()
    for p in RESULTS.rglob("*.png"):
        shutil.copy2(p, KEPT / p.name)
        names.add(p.name)
    return names
