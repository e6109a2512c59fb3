"""JupyterLab server for the real-browser test (Galata's test settings: no token, no XSRF).

Never use this configuration for a real server.
"""

import os

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821
c.ServerApp.port = int(os.environ.get("TF_LAB_PORT", "8888"))  # noqa: F821
c.ServerApp.ip = "127.0.0.1"  # noqa: F821
c.ServerApp.allow_root = True  # noqa: F821  (the test machines run as root)
