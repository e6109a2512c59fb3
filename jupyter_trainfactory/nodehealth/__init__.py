"""Node health before a job (``%train health``, ``trainfactory.health``).

Named ``nodehealth``, not ``health``: an imported subpackage ``health`` would shadow the
API function ``trainfactory.health`` (as ``reliability`` did before it became ``fleet``).

``check.py`` (the :class:`~.check.Check` record), ``gpu.py`` (NVML checks of one node's
GPUs, pynvml passed in), ``host.py`` (psutil checks of one node), ``node.py`` (the Ray
job that runs them on every alive node, and the kernel side that submits it) and
``report.py`` (the cross-node decisions and the table). Imports are lazy: importing this
package needs neither Ray, pynvml nor psutil.
"""
