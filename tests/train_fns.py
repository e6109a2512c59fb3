"""Training functions used by the tests (shipped by value to the cluster).

``ray.train`` is imported at the top on purpose, as most training files do: importing
Ray before the embedded services exist must not break authentication.
"""

import time

import ray.train


def short_loop(config):
    """Reports ``config["steps"]`` times, with ``samples`` and a metric per report."""

    for i in range(config["steps"]):
        time.sleep(config.get("sleep", 0.05))
        ray.train.report({"loss": 1.0 / (i + 1), "samples": 8, "lr": config.get("lr", 0.1)})


def long_loop(config):
    """Reports forever (until stopped or killed)."""

    i = 0
    while True:
        time.sleep(0.2)
        i += 1
        ray.train.report({"loss": 1.0 / i, "samples": 4})


def failing_loop(config):
    """Fails on its second report."""

    ray.train.report({"loss": 1.0})
    raise ValueError("bad batch at step 2")
