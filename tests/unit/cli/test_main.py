"""The command line's entry points: every way of starting it lists every command."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ("validate", "plan", "simulate", "whatif", "profile", "run", "status", "down")


@pytest.mark.parametrize("entry", [["-m", "rubberband.cli.main"], ["-m", "rubberband"]])
def test_every_entry_point_lists_every_command(entry):
    out = subprocess.run([sys.executable, *entry, "--help"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()[0] in COMMANDS]
    assert listed == list(COMMANDS)


CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")


@pytest.mark.parametrize(("argv", "needles"), [
    (["plan", CIFAR, "--confidence", "90%"], ["--confidence: expected a probability between 0 and 1", "0.9", "'90%'"]),
    (["plan", CIFAR, "--budget", "$15"], ["--budget: expected an amount of dollars", "--budget 15", "'$15'"]),
    (["plan", CIFAR, "--market", "spt"], ["--market: unknown value 'spt'", "did you mean `spot`?",
                                          "on-demand, spot, auto"]),
    (["run", CIFAR, "--market", "spt"], ["--market: unknown value 'spt'"]),
    (["plan", CIFAR, "--samples", "many"], ["--samples: expected a whole number", "'many'"]),
    (["plan", CIFAR, "--bogus"], ["unrecognized arguments: --bogus", "rubberband plan --help"]),
    (["plan"], ["the following arguments are required: experiment", "rubberband plan --help"]),
])
def test_argument_errors_are_one_line_with_the_fix_not_usage(capsys, argv, needles):
    from rubberband.cli.main import main

    from .helpers import assert_one_line_error

    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage:" not in err
    assert_one_line_error(err, *needles)


def test_debug_works_after_the_subcommand(capsys):
    from rubberband.cli.main import main
    from rubberband.errors import InfeasibleDeadlineError

    assert main(["plan", CIFAR, "--samples", "20", "--deadline", "1m"]) == 2
    with pytest.raises(InfeasibleDeadlineError):        # --debug: the traceback, wherever the flag is
        main(["plan", CIFAR, "--samples", "20", "--deadline", "1m", "--debug"])
    with pytest.raises(InfeasibleDeadlineError):
        main(["--debug", "plan", CIFAR, "--samples", "20", "--deadline", "1m"])


@pytest.mark.parametrize("command", ["run", "profile", "down", "status"])
def test_an_unknown_provider_is_named_before_any_other_error(capsys, command):
    from rubberband.cli.main import main

    from .helpers import assert_one_line_error

    argv = [command] + ([str(ROOT / "nope.yaml"), "--samples", "0"] if command in ("run",) else
                        [str(ROOT / "nope.yaml")] if command == "profile" else [])
    assert main([*argv, "--provider", "gpc"]) == 2
    assert_one_line_error(capsys.readouterr().err, "--provider: unknown provider 'gpc'")


def test_down_on_aws_without_credentials_is_one_line(capsys, monkeypatch, tmp_path):
    pytest.importorskip("boto3")
    from rubberband.cli.main import main

    from .helpers import assert_one_line_error

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.chdir(tmp_path)          # no runs/ of an earlier run to find
    assert main(["down", "--provider", "aws"]) == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, "credentials")
    assert "AWS_PROFILE" in err and "aws configure" in err      # the line names the fix
