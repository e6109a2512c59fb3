"""Small frictions of a new user's trial (issue 14, item 9): no abbreviated options, an
unquoted --config, bare subcommands after a kernel restart, notebook variables in the
line, and a second launch of a function whose job still runs."""

import cloudpickle
import pytest
import train_fns
from conftest import ipython_shell
from IPython.core.error import UsageError

from jupyter_trainfactory import cli
from jupyter_trainfactory.arguments import CommandError, build_parser, parse
from jupyter_trainfactory.commands import default_job, register_text, still_running_text
from jupyter_trainfactory.jobs import JobInfo
from jupyter_trainfactory.magics import TrainMagics, expand_variables

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/


@pytest.fixture(scope="module")
def ip():
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_trainfactory")
    shell.run_cell("def train(config):\n    pass\n")
    return shell


def _usage_error(ip, line: str) -> str:
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("train", line)
    text = str(err.value)
    assert "\n" not in text.strip()
    return text


def _info(job_id: str, name: str, state: str, step: int | None = 3) -> JobInfo:
    return JobInfo(
        job_id, name, state, "me", "1", "r" + job_id, "RUNNING", "", step, 0.0, None, "", "",
        "", None, "",
    )  # fmt: skip


# -- 1. no abbreviations ------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, suggestion",
    [
        ("launch train --worker 2", "--workers"),
        ("launch train --worke=2", "--workers"),
        ("launch train --max 1", "--max-failures or --max-preemptions"),
        ("costs --exp tests", "--experiment"),
        ("logs tf-00000000 --fol", "--follow"),
    ],
)
def test_abbreviated_or_misspelt_option_is_refused_naming_the_option(line, suggestion):
    for parser in (build_parser("%train"), build_parser(cli.PROG, "FILE.py:FUNC")):
        with pytest.raises(CommandError) as err:
            parse(line, parser)
        option = line.split(" --", 1)[1].split()[0].split("=")[0]
        assert f"--{option} is not an option" in str(err.value)
        assert f"did you mean {suggestion}?" in str(err.value)


def test_abbreviation_refused_in_the_magic_and_the_cli(ip, capsys):
    assert "did you mean --workers?" in _usage_error(ip, "launch train --worker 2")
    assert cli.main(["launch", "f.py:train", "--worker", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "jupyter trainfactory: error: launch: --worker is not an option"
        " (options are never abbreviated); did you mean --workers?"
    )


# -- 2. an unquoted --config -------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, left_over",
    [
        ("launch train --config {'lr': 0.01}", "0.01}"),
        ("launch train --config {'a': [1, 2]} --workers 1", "[1, 2]}"),
        ("launch train --config {'a':1, 'b':2}", "b:2}"),
    ],
)
def test_unquoted_config_says_to_quote_it(ip, line, left_over):
    text = _usage_error(ip, line)
    assert "the --config value must be quoted as one argument" in text
    assert text.endswith(f"left over: {left_over}).")
    with pytest.raises(CommandError, match="must be quoted"):
        parse(line.split(), build_parser(cli.PROG))  # the CLI's argv, split by the shell


def test_other_leftovers_stay_unrecognized_arguments():
    with pytest.raises(CommandError) as err:
        parse("launch train --config x extra")
    assert str(err.value) == "launch: unrecognized arguments: extra"


# -- 4. notebook variables in the line -------------------------------------------------
def test_each_group_expands_on_its_own():
    ns = {"n": 2, "name": "r1"}
    assert (
        expand_variables("launch f --workers $n --config \"{'epochs': 2}\"", ns)
        == "launch f --workers 2 --config \"{'epochs': 2}\""
    )
    assert expand_variables("--run-name x{n * 3}-$name.txt", ns) == "--run-name x6-r1.txt"
    # kept as written: a dict or set display, a failing expression, single-quoted $, $$
    line = "{'epochs': n} {a, b} {undefined} {} '$n' $$n cost$$"
    assert expand_variables(line, ns) == "{'epochs': n} {a, b} {undefined} {} '$n' $n cost$"
    assert expand_variables("--config \"{'epochs': $n}\"", ns) == "--config \"{'epochs': 2}\""
    assert expand_variables("{{n}} {(1, 2)}", ns) == "{n} (1, 2)"
    with pytest.raises(CommandError, match=r"\$nope names no notebook variable"):
        expand_variables("--workers $n --run-name $nope", ns)


def test_magic_expands_variables_next_to_a_quoted_dict(ip):
    ip.user_ns["n"] = 0
    # IPython itself gives up on the whole line here and passes "$n" on: we expand it.
    line = "launch train --workers $n --config \"{'epochs': 2}\""
    assert "--workers must be at least 1, got 0" in _usage_error(ip, line)
    ip.user_ns["n"] = 1
    # The dict reaches --config as written, and --config evaluates it in the notebook.
    text = _usage_error(ip, "launch train --workers $n --config \"{'epochs': n, 'x': 1/0}\"")
    assert text.startswith("--config \"{'epochs': n, 'x': 1/0}\" failed: ZeroDivisionError")
    assert "$undefined_var names no notebook variable" in _usage_error(
        ip, "launch train --workers $undefined_var"
    )


# -- 3 and 5: the user's running jobs --------------------------------------------------------
def test_default_job_after_a_restart():
    jobs = [_info("tf-3", "train", "SUCCEEDED"), _info("tf-2", "train", "RUNNING", 40)]
    job_id, note = default_job(jobs, "attach")
    assert job_id == "tf-2"
    assert note == (
        "No job launched from this kernel yet: using tf-2 (train, RUNNING, step 40),"
        " your only running job."
    )
    with pytest.raises(CommandError) as err:
        default_job([_info("tf-5", "a", "PENDING", None), *jobs], "stop")
    assert "2 of yours are running: tf-5 (a, PENDING), tf-2 (train, RUNNING, step 40)" in str(
        err.value
    )
    assert str(err.value).endswith("give one, as in %train stop tf-5.")
    with pytest.raises(CommandError, match="none of yours is running; give a job id"):
        default_job(jobs[:1], "status")


def test_still_running_text_names_the_same_functions_jobs():
    jobs = [
        _info("tf-new", "train", "PENDING", None),
        _info("tf-other", "eval", "RUNNING"),
        _info("tf-old", "train", "RUNNING", 12),
        _info("tf-done", "train", "STOPPED"),
    ]
    assert still_running_text(jobs, "tf-new", "train") == (
        "Still running from 'train' as well: tf-old (train, RUNNING, step 12);"
        " stop it with %train stop tf-old."
    )
    assert still_running_text(jobs, "tf-new", "fresh") == ""
    two = still_running_text([_info("tf-x", "train", "RESTARTING"), *jobs], "tf-new", "train")
    assert "tf-x (train, RESTARTING, step 3), tf-old" in two and two.endswith("%train stop JOB.")


def test_bare_resume_after_a_restart_asks_for_a_job(ip):
    fresh = TrainMagics(shell=ip)  # what a kernel restart leaves: no last job
    with pytest.raises(CommandError, match="give a job id, as in %train resume JOB"):
        fresh._job_id(parse("resume"))


def test_registers_load_line_points_mlflow_at_the_registry_first():
    # a new user's copy of the printed line failed: the kernel's MLflow looked in ./mlflow.db
    version = {"name": "digits", "version": 1, "alias": "champion", "step": 24}
    version["uri"] = "models:/digits@champion"
    version["tracking_uri"] = "http://alice:s3cret@127.0.0.1:5000"
    text = register_text(version)
    assert text.endswith(
        "load it with import mlflow; mlflow.set_tracking_uri('http://alice:***@127.0.0.1:5000');"
        " mlflow.pyfunc.load_model('models:/digits@champion')"
    ), text
