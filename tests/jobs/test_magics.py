"""%train in a real IPython InteractiveShell: bad input is one UsageError line, nothing submitted."""

import pytest
from conftest import ipython_shell
from IPython.core.error import UsageError


@pytest.fixture(scope="module")
def ip(services):
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_trainfactory")
    shell.run_cell("def train(config):\n    pass\nnot_a_function = 42\ngood_config = {'a': 1}")
    return shell


def _job_count(manager):
    return len(manager.list(all_users=True))


@pytest.mark.parametrize(
    "line, message",
    [
        ("", "Give a subcommand"),
        ("frobnicate", "invalid choice: 'frobnicate'"),
        ("launch train --bogus 3", "unrecognized arguments: --bogus 3"),
        ("launch undefined_fn", "'undefined_fn' is not defined in this notebook"),
        ("launch not_a_function", "'not_a_function' is a int, not a function"),
        ("launch train --workers 0", "--workers must be at least 1"),
        ("launch train --config 1/0", "--config '1/0' failed: ZeroDivisionError"),
        ("launch train --config [1]", "--config must give a dict, got list"),
        ("launch train --gpus-per-worker 1", "No node of the cluster has 1 CPU, 1 GPU"),
        ("launch train --workers 50", "can hold at most"),
        ("launch train --cpus-per-worker 64", "No node of the cluster has 64 CPU"),
        ("launch train --working-dir /nonexistent/dir", "does not exist"),
        ("launch train --env NOVALUE", "KEY=VALUE"),
        ("status tf-zzzz", "is not a job id"),
        ("status tf-00000000", "No job tf-00000000 is recorded"),
        ("resume tf-00000000", "No job tf-00000000 is recorded"),
        ("logs tf-00000000 --rank 0", "No job tf-00000000 is recorded"),
        ("chaos tf-00000000", "one of the arguments --kill-worker --kill-node is required"),
        ("launch train --on-stall stop", "--on-stall stop needs --stall-timeout SECONDS"),
        ("launch train --stall-timeout 30 --on-stall restart", "set --max-failures"),
        ("launch train --stall-timeout 0", "stall_timeout must be at least 1"),
        ("launch train --input data", "--input takes NAME=DATA"),
        ("launch train --input train=nosuchvar", "no notebook variable or file is named"),
        ("launch train --input train=/no/such/data", "Input 'train': "),
        ("launch train --model-fn nope", "'nope' is not defined in this notebook"),
        ("launch train --target-steps 0", "target_steps must be at least 1"),
        ("register tf-00000000", "the following arguments are required: --name"),
        ("register tf-00000000 --name m", "No job tf-00000000 is recorded"),
        ("register tf-00000000 --name m --alias 1x", "An alias is a letter"),
        ("costs --since lastweek", "--since takes a date"),
        ("costs --experiment no-such-experiment", "No experiment 'no-such-experiment'"),
        ("gc --keep 0", "--keep must be a whole number of at least 1"),
    ],
)
def test_bad_input_is_one_usage_error_and_submits_nothing(ip, manager, line, message):
    before = _job_count(manager)
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("train", line)
    assert message in str(err.value)
    assert "\n" not in str(err.value).strip()
    assert _job_count(manager) == before


@pytest.mark.timeout(120)
def test_unreachable_address_is_one_sentence(ip, manager):
    before = _job_count(manager)
    with pytest.raises(UsageError, match="Cannot reach the Ray cluster at http://127.0.0.1:9"):
        ip.run_line_magic("train", "launch train --address http://127.0.0.1:9")
    assert _job_count(manager) == before


def test_services_and_config(ip, services, capsys):
    ip.run_line_magic("train", "services")
    out = capsys.readouterr().out
    assert services.tracking_uri in out and str(services.processes["ray"].pid) in out
    ip.run_line_magic("config", "TrainMagics.experiment = 'from-config'")
    magics = ip.magics_manager.registry["TrainMagics"]
    assert magics.experiment == "from-config"
    ip.run_line_magic("train", "help")
    assert "launch" in capsys.readouterr().out
    ip.run_line_magic("train", "launch -h")  # prints the subcommand's help, no error
    assert "--cpus-per-worker" in capsys.readouterr().out
