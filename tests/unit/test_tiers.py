"""The tiers hold (tests/README.md): this tree's conftest, run by pytester on probe tests, fails
a unit test that asks for or starts a service, and refuses a test outside every tier."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

PROBES = """
def test_asks_for_the_services(services):
    pass


def test_starts_a_head_by_another_path():
    from jupyter_trainfactory import services

    services.ensure_services()


def test_calls_ray_init():
    import ray

    ray.init()


def test_starts_nothing():
    assert 1 + 1 == 2
"""


@pytest.fixture
def tree(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    (pytester.path / "unit").mkdir()
    (pytester.path / "unit" / "test_probes.py").write_text(PROBES)
    return pytester


def test_a_unit_test_that_asks_for_or_starts_a_service_fails_naming_its_tier(tree):
    result = tree.runpytest_subprocess("unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_asks_for_the_services asks for 'services'*move it to tests/jobs/*",
            "*test_starts_a_head_by_another_path starts a Ray head or an MLflow server,"
            " which tests/unit/ does not allow: move it to tests/jobs/*",
            "*test_calls_ray_init starts Ray (ray.init)*move it to tests/jobs/*",
        ],
        consecutive=False,
    )


def test_a_test_outside_every_tier_is_refused(tree):
    (tree.path / "loose").mkdir()
    (tree.path / "loose" / "test_loose.py").write_text("def test_x():\n    pass\n")
    result = tree.runpytest_subprocess("loose", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_loose.py::test_x is outside the test tiers*"])
