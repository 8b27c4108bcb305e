"""Every refusal in its reader's words (issue #39): the library (everything outside ``lightning_srifty/cli/``) names
parameters, never flags, so that a Python user of ``launch()``, ``generate()`` or ``job_from_plan()`` and the HTTP
service read the names they gave; ``srifty`` says the same refusal with the running command's own flags, read off its
parser (``ConfigError.between`` templates and refusals with parts). A flag written into a library message is found by
reading the source, apart from the few below that name another program's or another command's option on purpose."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from conftest import ROOT
from lightning_srifty.cli import build_parser, error_words, main
from predictor.documents.plan import load_plan
from predictor.exceptions import ConfigError

EXAMPLES = ROOT / "terraform" / "examples"
ON_DEMAND_PLAN = EXAMPLES / "single-node-on-demand" / "plan.json"  # 10 on-demand fleets, no deadline
SPOT_PLAN = EXAMPLES / "multi-node-spot" / "plan.json"  # 4 spot fleets, no deadline

# the calls whose first argument is an error's message (a template, or the parameter's words for refused()): every
# error class of predictor.exceptions the library raises with a message
RAISERS = (
    "ConfigError", "NoFeasibleConfigError", "between", "refused", "named", "SriftyError", "ProfileError",
    "ProfileSchemaError", "CatalogError", "UnknownNameError", "PredictionError", "ServiceError", "ProvisionError",
    "PreflightError", "MigrationError", "CapacityError", "RehearsalFailed", "fail",
)  # fmt: skip
FLAG = re.compile(r"--[a-z{]")  # a long option, or one written from a name (f"--{name}")

QUOTA_REQUEST = "aws service-quotas request-service-quota-increase --service-code ec2 ... --region {region}"
# (file, words of the message): why the flag stays literal. Only another program's option, or another srifty
# command's, named with that command: never a parameter of the function that raises.
ALLOWED = {
    ("lightning_srifty/profiling/fabric.py", "`srifty recommend srifty/profile.json --steps N`"): "how a profile "
    "written alone is ranked later: another command, named with it (the profiler's own parameter is constraints=)",
    ("predictor/runs/deadline.py", "srifty recommend --deadline"): "how a plan gets a deadline: another command "
    "(the replay's own parameter, deadline_h, is a field of the template)",
    ("lightning_srifty/provision/launcher/spot_guard.py", "srifty recommend --deadline H"): "how a plan gets a "
    "deadline: another command, named with it",
    ("lightning_srifty/provision/terraform/generate.py", "srifty recommend --profile {profile} --out plan.json"): "the "
    "command that ranks this project's profile: another command, named with it",
    ("lightning_srifty/provision/preflight.py", QUOTA_REQUEST): "the AWS CLI's command that files the quota request: "
    "another program's options",
    ("lightning_srifty/provision/terraform/command.py", "'train.py --epochs 90' or 'python -m pkg.train --lr 0.1'"): (
        "an example training command: the user's script's own arguments"
    ),
    ("lightning_srifty/provision/terraform/snapshot.py", "pip install --force-reinstall -e ."): "pip's command line",
    ("lightning_srifty/provision/terraform/generate.py", "pip install --force-reinstall lightning-srifty"): "pip's "
    "command line",
    ("predictor/documents/plan.py", "`srifty recommend --out plan.json`"): "a plan document that does not read: the "
    "command that makes one, named with it",
    ("predictor/service/observations.py", "`srifty serve --observations`"): "the service's start-up setting, named "
    "with the command that starts it",
    ("predictor/service/client.py", "`srifty serve --max-body`"): "the service's start-up setting, named with the "
    "command that starts it",
    ("lightning_srifty/provision/apply.py", "`srifty terraform --plan plan.json --out DIR`"): "the command that "
    "writes a root module, named with it",
    ("lightning_srifty/provision/preflight.py", "`srifty terraform --plan plan.json --out DIR`"): "the command that "
    "writes a root module, named with it",
    ("lightning_srifty/provision/preflight.py", "`srifty check --dir DIR`"): "the command that checks it",
    ("lightning_srifty/provision/apply.py", "`srifty apply --timeout-min`"): "the limit is timeout_s in Python and "
    "minutes in srifty's flag (no one name for both): both said, the flag with its command",
    ("lightning_srifty/provision/launcher/watches.py", "`srifty launch --stall-timeout-min`"): "stall_timeout_s in "
    "Python and minutes in srifty's flag (no one name for both): both said, the flag with its command",
    ("lightning_srifty/provision/launcher/watches.py", "`srifty launch --start-timeout-min`"): "start_timeout_s in "
    "Python, minutes in srifty's flag: both said, the flag with its command",
    ("lightning_srifty/provision/launcher/launch.py", "`srifty launch --after-fit-timeout-min`"): "after_fit_timeout_s "
    "in Python, minutes in srifty's flag: both said, the flag with its command",
    ("lightning_srifty/provision/aws.py", "`srifty launch --checkpoint-uri`"): "where a fleet's checkpoint folder was "
    "set, among its tag and the root's output: the launch's parameter and its flag with the command",
    ("lightning_srifty/provision/terraform/snapshot.py", "srifty terraform --no-code"): "no code at all has no "
    "parameter of its own (code=None): both said, the flag with its command",
    ("lightning_srifty/provision/rehearsal/walk.py", "srifty rehearse --timeout-s"): "the rehearsal's failure is also "
    "a line of its report, one text for every reader: the setting and the flag with its command",
    ("lightning_srifty/provision/rehearsal/walk.py", "srifty rehearse --notice-after-s"): "as the line above: the "
    "report's one text, the setting and the flag with its command",
    ("lightning_srifty/provision/launcher/legs.py", "srifty recommend --launchable"): "how a plan of fleets this "
    "account can start is made: another command, named with it",
    ("lightning_srifty/provision/preflight.py", "--launchable"): "account_limits() is read for srifty recommend "
    "--launchable alone (cli/recommend.py is its one caller): the refusal is of that flag",
    ("lightning_srifty/strategies/hetero.py", "srifty recommend --max-types 2"): "job side (inside the training "
    "script): where a plan with a per-GPU batch split comes from, another command named with it",
    ("lightning_srifty/strategies/nodes.py", "(--nproc_per_node)"): "job side: torchrun's option, another program's",
    ("lightning_srifty/strategies/nodes.py", "torchrun with --nproc_per_node="): "job side: torchrun's option",
    ("lightning_srifty/strategies/nodes.py", "(--nnodes)"): "job side: torchrun's option, another program's",
    ("lightning_srifty/migrate/checkpoints.py", "srifty terraform --name"): "job side (inside the training script): "
    "how a run gets a checkpoint folder of its own, another command named with it",
}


def _words(node: ast.expr) -> str:
    """The literal words of a message expression: string constants as written, every value shown as ``{}``
    (an f-string's, a name's, a call's)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_words(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _words(node.left) + _words(node.right)
    if isinstance(node, ast.IfExp):
        return _words(node.body) + " " + _words(node.orelse)
    return "{}"


@functools.cache
def _messages() -> list[tuple[str, int, str]]:
    """(file, line, the message's words) of every refusal raised outside the CLI."""
    found = []
    for top in ("predictor", "lightning_srifty"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("lightning_srifty/cli/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and node.args:
                    called = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    if called in RAISERS:
                        found.append((rel, node.lineno, " ".join(_words(a) for a in node.args)))  # fail(name, detail)
    return found


def test_no_library_refusal_writes_a_flag() -> None:
    """A flag in a library message reaches Python callers and the service as it is: name the parameter as a
    template's ``{field}`` (``ConfigError.between``) or through ``refused(...)``'s parts instead."""
    messages = _messages()
    assert len(messages) > 100  # the scan reads the raises (not an empty walk)
    written = []
    for rel, line, words in messages:
        for (where, allowed), _why in ALLOWED.items():
            if where == rel:
                words = words.replace(allowed, "")
        if FLAG.search(words):
            written.append(f"{rel}:{line}: {words[:120]!r}")
    assert not written, "flags written into library refusals:\n" + "\n".join(written)


def test_every_allowed_flag_is_still_there() -> None:
    """The allow-list holds no stale entry, and each says why."""
    messages = _messages()
    for (where, allowed), why in ALLOWED.items():
        assert why.strip(), where
        assert any(rel == where and allowed in words for rel, _, words in messages), (where, allowed)


# --- the refusals rewritten, from Python (the parameter) and from srifty (the flag, as before) ---------------------


def _cli(capsys, argv: list[str]) -> str:
    code = main(argv)
    said = capsys.readouterr().err
    assert code == 2, said
    assert "Traceback" not in said
    return said


def _words_of(argv: list[str], exc: ConfigError) -> str:
    """The refusal as ``srifty <argv>`` says it (its command's parser), for a path too slow to drive whole."""
    parser = build_parser()
    return error_words(exc, parser, parser.parse_args(argv))


def test_a_choice_out_of_the_plan_names_choice_or_the_flag(tmp_path, capsys) -> None:
    from lightning_srifty.provision.terraform.generate import generate

    plan = load_plan(ON_DEMAND_PLAN)
    with pytest.raises(ConfigError) as refused:
        generate(plan, tmp_path / "infra", choice=40)
    said = str(refused.value)
    assert said == "The plan has 10 ranked fleets: choice must be between 0 and 9. Got 40.", said
    assert refused.value.in_words("service").startswith("The plan has 10 ranked fleets: 'choice' must be")
    out = str(tmp_path / "infra")
    said = _cli(capsys, ["terraform", "--plan", str(ON_DEMAND_PLAN), "--out", out, "--choice", "40", "--no-code"])
    assert "--choice must be between 0 and 9. Got 40." in said


def test_the_spot_policy_refusals_name_the_parameter_or_the_flag(tmp_path, capsys, monkeypatch) -> None:
    from lightning_srifty.provision.launcher.spot_guard import policy_for

    spot, on_demand = load_plan(SPOT_PLAN), load_plan(ON_DEMAND_PLAN)
    with pytest.raises(ConfigError) as unknown:
        policy_for("cheap", spot.entries[0], spot)
    assert str(unknown.value).startswith("The 'spot_policy' parameter of launch() must be one of {srifty, greedy")
    assert "--" not in str(unknown.value)
    with pytest.raises(ConfigError) as no_spot:
        policy_for("srifty", on_demand.entries[0], on_demand)
    said = str(no_spot.value)
    assert said.startswith("spot_policy srifty steers a spot or mixed fleet") and "entry (choice)" in said, said
    assert "--" not in said
    with pytest.raises(ConfigError) as no_deadline:
        policy_for("greedy", spot.entries[0], spot)
    said = str(no_deadline.value)
    assert said.startswith("spot_policy greedy weighs spot against a deadline") and "use spot_policy off" in said
    assert "--" not in said.replace("srifty recommend --deadline H", "")
    # srifty launch: the same refusals with its flags (before any fleet or process starts)
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print('train')\n")
    said = _cli(capsys, ["launch", "--plan", str(ON_DEMAND_PLAN), "--spot-policy", "srifty", "--", "train.py"])
    assert "--spot-policy srifty steers a spot or mixed fleet" in said
    assert "(--choice) or leave --spot-policy off" in said and "spot_policy" not in said, said
    said = _cli(capsys, ["launch", "--plan", str(SPOT_PLAN), "--spot-policy", "greedy", "--", "train.py"])
    assert "--spot-policy greedy weighs spot" in said and "use --spot-policy off" in said and "spot_policy" not in said
    assert _words_of(["launch", "--plan", "p.json"], unknown.value).startswith("--spot-policy must be one of {srifty")


def test_an_ssh_cidr_refusal_names_the_option_or_the_flag(tmp_path, capsys) -> None:
    from lightning_srifty.provision.terraform.generate import Options, ssh_cidr_blocks, tfvars

    with pytest.raises(ConfigError) as everyone:
        tfvars(load_plan(ON_DEMAND_PLAN), 0, Options(ssh_cidr=("0.0.0.0/0",), code=None))
    said = str(everyone.value)
    assert said.startswith("ssh_cidr 0.0.0.0/0 together cover every IPv4 address") and "use ssm_session" in said
    assert "--" not in said
    with pytest.raises(ConfigError) as wide:
        ssh_cidr_blocks(["10.0.0.0/7"])
    assert "or give allow_wide_ssh if that is intended" in str(wide.value) and "--" not in str(wide.value)
    with pytest.raises(ConfigError) as bad:
        ssh_cidr_blocks(["10.0.0.1/8"])
    assert str(bad.value).startswith("ssh_cidr '10.0.0.1/8' is not an IPv4 CIDR block") and "--" not in str(bad.value)
    base = ["terraform", "--plan", str(ON_DEMAND_PLAN), "--out", str(tmp_path / "infra"), "--no-code"]
    said = _cli(capsys, [*base, "--ssh-cidr", "0.0.0.0/0"])
    assert "--ssh-cidr 0.0.0.0/0 together cover every IPv4 address" in said
    assert "leave --ssh-cidr out and use --ssm-session" in said
    said = _cli(capsys, [*base, "--ssh-cidr", "10.0.0.0/7"])
    assert "or give --allow-wide-ssh if that is intended" in said


def test_a_replay_of_a_plan_without_a_deadline_names_deadline_h_or_the_flag(tmp_path, capsys, catalog) -> None:
    from predictor.runs.deadline import job_from_plan

    plan = load_plan(SPOT_PLAN)
    with pytest.raises(ConfigError) as none:
        job_from_plan(plan, catalog=catalog)
    said = str(none.value)
    assert none.value.parameter == "deadline_h" and "give one (deadline_h)" in said, said
    assert "--" not in said.replace("srifty recommend --deadline", "")
    with pytest.raises(ConfigError) as out_of_range:
        job_from_plan(plan, 9, deadline_h=10, catalog=catalog)
    assert str(out_of_range.value) == "The plan has 4 ranked fleets: choice must be between 0 and 3. Got 9."
    trace = str(tmp_path / "trace.json")  # never read: the plan is refused first
    said = _cli(capsys, ["replay", "--plan", str(SPOT_PLAN), "--trace", trace])
    assert "The plan has no deadline: give one (--deadline)" in said and "deadline_h" not in said, said
    said = _cli(capsys, ["replay", "--plan", str(SPOT_PLAN), "--trace", trace, "--choice", "9", "--deadline", "10h"])
    assert "The plan has 4 ranked fleets: --choice must be between 0 and 3. Got 9." in said


def test_a_checkpoint_uri_that_is_no_s3_folder_names_checkpoint_uri_or_the_flag(tmp_path, capsys, monkeypatch) -> None:
    from lightning_srifty.provision.aws import split_s3

    with pytest.raises(ConfigError) as refused:
        split_s3("my-bucket/runs")
    said = str(refused.value)
    assert "The checkpoint URI 'my-bucket/runs' is not an S3 folder" in said
    assert "(checkpoint_uri, an existing bucket)" in said and "--" not in said
    assert "('checkpoint_uri', an existing bucket)" in refused.value.in_words("service")
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print('train')\n")
    argv = ["launch", "--plan", str(ON_DEMAND_PLAN), "--provisioner", "terraform", "--checkpoint-uri", "my-bucket/runs"]
    said = _cli(capsys, [*argv, "--no-code", "--", "train.py"])
    assert "The checkpoint URI 'my-bucket/runs' is not an S3 folder" in said
    assert "(--checkpoint-uri, an existing bucket)" in said


def test_the_rehearsal_settings_name_their_fields_or_the_flags() -> None:
    from lightning_srifty.provision.rehearsal import walk

    values = {"groups": [{}, {}]}
    with pytest.raises(ConfigError) as nodes:
        walk._check_settings(walk.Settings(nodes=0), values)
    assert "The 'nodes' parameter of the rehearsal's Settings" in str(nodes.value)
    assert _words_of(["rehearse", "--dir", "x"], nodes.value) == "--nodes must be a whole number >= 1. Got 0."
    with pytest.raises(ConfigError) as stagger:
        walk._check_settings(walk.Settings(stagger_s=-1), values)
    assert _words_of(["rehearse", "--dir", "x"], stagger.value).startswith("--stagger-s must be a number of seconds")
    with pytest.raises(ConfigError) as mixed:
        walk._check_settings(walk.Settings(nodes=1), values)
    assert str(mixed.value).startswith("nodes 1: the fleet mixes 2 instance types") and "--" not in str(mixed.value)
    assert _words_of(["rehearse", "--dir", "x"], mixed.value).endswith("leave --nodes out (every node of the fleet is "
                                                                       "rehearsed)")  # fmt: skip


def test_the_options_named_by_another_dest_still_say_their_flags() -> None:
    """--extra-index-url and --include-secret set Options' extra_index_urls and include_secrets, --deadline
    job_from_plan()'s deadline_h, --max-hourly max_hourly_usd: a refusal of each names the flag."""
    for argv, dest, flag in (
        (["terraform", "--plan", "p", "--out", "o"], "extra_index_urls", "--extra-index-url"),
        (["terraform", "--plan", "p", "--out", "o"], "include_secrets", "--include-secret"),
        (["launch", "--plan", "p"], "include_secrets", "--include-secret"),
        (["replay", "--plan", "p", "--trace", "t"], "deadline_h", "--deadline"),
        (["replay", "--plan", "p", "--trace", "t"], "step_quantile", "--step-quantile"),
        (["terraform", "--plan", "p", "--out", "o"], "max_hourly_usd", "--max-hourly"),
    ):
        error = ConfigError.between("raise {" + dest + "}.", parameter=dest)
        assert _words_of(argv, error) == f"raise {flag}.", (argv, dest)


def test_a_guard_names_choice_and_the_guard_or_the_flags(catalog) -> None:
    from lightning_srifty.provision.terraform.money import check_limits

    with pytest.raises(ConfigError) as many:
        check_limits(4, 10.0, 3, None)
    said = str(many.value)
    assert said == (
        "The fleet has 4 instances, more than max_instances = 3: choose a smaller fleet (choice) or raise the guard "
        "(max_instances)."
    )
    words = _words_of(["terraform", "--plan", "p", "--out", "o"], many.value)
    assert words.endswith("choose a smaller fleet (--choice) or raise the guard (--max-instances).")
    with pytest.raises(ConfigError) as costly:
        check_limits(1, 10.0, None, 5.0)
    words = _words_of(["terraform", "--plan", "p", "--out", "o"], costly.value)
    assert "more than max_hourly_usd = $5.0000/h" in words and words.endswith("raise the guard (--max-hourly).")
    # srifty apply has neither flag: the library's words stand
    assert _words_of(["apply", "--dir", "d"], many.value) == said


def test_the_terraform_options_with_parts_name_the_option(catalog) -> None:
    from lightning_srifty.provision.terraform.command import check_ami, check_secret_env

    with pytest.raises(ConfigError) as ami:
        check_ami("ami-1$(id)")
    assert str(ami.value).startswith("The 'ami' parameter of the Terraform options") and "--" not in str(ami.value)
    assert _words_of(["terraform", "--plan", "p", "--out", "o"], ami.value).startswith("--ami must be an AMI id")
    with pytest.raises(ConfigError) as secret:
        check_secret_env(["HF_TOKEN=vault:{x}"])
    said = str(secret.value)
    assert said.startswith("secret_env 'HF_TOKEN=vault:{x}': the source must be") and "--" not in said, said
    assert "e.g. secret_env HF_TOKEN=ssm:/team/hf-token" in said
    words = _words_of(["terraform", "--plan", "p", "--out", "o"], secret.value)
    assert words.startswith("--secret-env 'HF_TOKEN=vault:{x}'") and "e.g. --secret-env HF_TOKEN=" in words


def test_launch_refuses_a_choice_outside_the_plan_before_anything_starts(tmp_path) -> None:
    """launch() read plan.entries[choice] unchecked: 40 raised a bare IndexError (a negative one its settings
    refuse)."""
    from lightning_srifty.provision.launcher.launch import launch

    plan = load_plan(ON_DEMAND_PLAN)
    with pytest.raises(
        ConfigError, match=r"^The plan has 10 ranked fleets: choice must be between 0 and 9\. Got 40\.$"
    ):
        launch(plan, ["true"], workdir=str(tmp_path / "run"), choice=40)
    with pytest.raises(ConfigError, match=r"'choice' parameter of launch\(\) must be an int >= 0"):
        launch(plan, ["true"], workdir=str(tmp_path / "run"), choice=-1)
    assert not (tmp_path / "run").exists()


def test_a_region_without_a_price_names_the_region_or_the_flag(catalog) -> None:
    """The Terraform writer's guard named the region as '(--region eu-west-9)' to Python too; a plan document's path
    is still said as it is."""
    from lightning_srifty.provision.terraform.money import group_usd_per_hour

    with pytest.raises(ConfigError) as region:
        group_usd_per_hour(catalog, "p4d.24xlarge", "eu-west-9", 1, 0, "region")
    said = str(region.value)
    assert "in eu-west-9, but the plan buys 1 there (region)." in said and "--" not in said, said
    words = _words_of(["terraform", "--plan", "p", "--out", "o"], region.value)
    assert "(--region)." in words, words
    with pytest.raises(ConfigError) as path:
        group_usd_per_hour(catalog, "p4d.24xlarge", "eu-west-9", 1, 0, "entries[0].groups[0].instance_type")
    assert "(entries[0].groups[0].instance_type)." in str(path.value)


def test_a_guard_read_from_written_values_says_how_to_write_them_again() -> None:
    """srifty apply sets neither guard: its refusal named `choice` and `max_instances` in Python's words (a review
    found it); a guard read from a root module's values says the command that writes them, with its flags."""
    from lightning_srifty.provision.terraform.money import check_limits

    with pytest.raises(ConfigError) as many:
        check_limits(4, 10.0, 3, None, written=True)
    assert str(many.value).endswith(
        "a limit of the written values: write the module again with `srifty terraform` for a smaller fleet "
        "(--choice) or a higher --max-instances."
    )
    assert _words_of(["apply", "--dir", "d"], many.value) == str(many.value)
