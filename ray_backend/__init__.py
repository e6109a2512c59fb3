"""Code that runs inside the Ray cluster: the job driver, RunRecorder, callbacks and samplers.

Shipped to the cluster as a runtime_env py_module; imports nothing from Jupyter.
"""
