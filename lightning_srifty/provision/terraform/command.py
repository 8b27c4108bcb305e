"""The training command a fleet runs, as torchrun's argv: the script (or ``-m module``) and its arguments.

Every node runs ``torchrun <rendezvous options> <argv>``; torchrun starts Python itself, so a command written the
way one runs it by hand, ``python train.py --epochs 90``, would make torchrun open a file named ``python``. This
module turns what users write into what torchrun takes:

    train.py --epochs 90                    -> ["train.py", "--epochs", "90"]
    python train.py --epochs 90             -> ["train.py", "--epochs", "90"]
    python3 -u train.py                     -> ["train.py"]            (user_data sets PYTHONUNBUFFERED=1)
    python -m pkg.train --lr 0.1            -> ["-m", "pkg.train", "--lr", "0.1"]   (torchrun's own -m)
    python -m torch.distributed.run ...     -> refused: srifty starts torchrun itself

The words are split like a POSIX shell (``shlex``); the Terraform module quotes each of them again in user_data.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from predictor.documents.checks import refused
from predictor.exceptions import ConfigError

_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
# whose parameters the options are (srifty terraform names their flags, read off its parser)
OPTIONS_OWNER = "the Terraform options (lightning_srifty.provision.terraform.generate.Options)"


def _refuse(command: str, why: str) -> ConfigError:
    return ConfigError.between(
        "The {train_command} {command!r} {why} Give the script and its arguments, e.g. {train_command} "
        "'train.py --epochs 90' or 'python -m pkg.train --lr 0.1'.",
        parameter="train_command",
        value=command,
        command=command,
        why=why,
    )


def train_argv(command: str) -> list[str]:
    """What torchrun starts for ``command`` (see the module docstring).

    Raises:
        ConfigError: the command is empty, cannot be split, is a launcher itself, or uses a Python option torchrun
            cannot pass on (``-c``, ``-O``, ``-X`` ...).
    """
    argv, why = torchrun_argv(command)
    if why:
        raise _refuse(command, why)
    return argv


def torchrun_argv(command: str) -> tuple[list[str], str]:
    """``(argv, "")``: what torchrun starts for ``command``; or ``([], why)``: why torchrun cannot start it, for the
    caller to say in its own words (:func:`train_argv` for the Terraform options, ``srifty launch`` for its
    command)."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return [], f"cannot be split into words ({exc})."
    if not words:
        return [], "is empty: torchrun needs a script to start on every node."
    launcher = "starts a launcher: srifty runs torchrun with the fleet's rendezvous itself."
    if words[0].rsplit("/", 1)[-1] in _LAUNCHERS:
        return [], launcher
    if not _PYTHON.match(words[0]):
        return words, ""
    rest = words[1:]
    while rest and rest[0] == "-u":  # unbuffered output: user_data exports PYTHONUNBUFFERED=1
        rest = rest[1:]
    if not rest:
        return [], "names the interpreter but no script."
    if rest[0] == "-m":
        if len(rest) < 2:
            return [], "has -m without a module."
        return ([], launcher) if rest[1] in _LAUNCHERS else (rest, "")
    if rest[0].startswith("-"):
        return [], f"passes the Python option {rest[0]!r}, which torchrun cannot pass on."
    return rest, ""


def torchrun_script(argv: list[str]) -> list[str]:
    """``argv`` (:func:`torchrun_argv`'s: a script, or ``-m`` and a module, and their arguments) as torchrun's command
    line ends: after a ``--`` that ends torchrun's own options (after ``-m``). torchrun's parser reads every word of
    the line for its options' abbreviations, so a script's ``--log`` (``--log-dir``, ``--logs-specs``) or ``--max``
    refused the whole command (a trial). The module's user data does the same (``train_words`` in main.tf)."""
    if argv[:1] == ["-m"]:
        return ["-m", "--", *argv[1:]]
    return ["--", *argv]


# ---------------------------------------------------------------------------------------------------------------------
# Values that reach the instances' shell and IAM policy: checked here, and again by the module's validation blocks
# ---------------------------------------------------------------------------------------------------------------------

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_PREFIX = re.compile(r"^([A-Za-z0-9_-][A-Za-z0-9._-]*/)+$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_AMI = re.compile(r"^ami-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9._+=,@:-]{1,255}$")  # EC2 allows more; none of these is special to a shell
ROOT_VOLUME_GB = (30, 16384)  # the module's bounds (variables.tf): gp3's maximum; the Deep Learning AMI needs 75


def check_ami(ami: str) -> str:
    """``ami`` when it is an AMI id, ``ami-`` and 8 or 17 lower-case hex digits."""
    if not isinstance(ami, str) or not _AMI.match(ami):
        raise refused(
            f"The 'ami' parameter of {OPTIONS_OWNER}",
            "an AMI id: ami- and 8 or 17 lower-case hex digits",
            ami,
            "Copy it from the EC2 console or `aws ec2 describe-images`, e.g. ami-0123456789abcdef0.",
            parameter="ami",
            owner=OPTIONS_OWNER,
        )
    return ami


def check_key_name(name: str) -> str:
    """``name`` when it is an EC2 key pair name of letters, digits and ``. _ + = , @ : -`` (no shell metacharacter,
    no space)."""
    if not isinstance(name, str) or not _KEY_NAME.match(name):
        raise refused(
            f"The 'key_name' parameter of {OPTIONS_OWNER}",
            "an EC2 key pair name of 1 to 255 letters, digits and . _ + = , @ : - (no spaces or shell characters)",
            name,
            "Give the name of a key pair of the region (`aws ec2 describe-key-pairs`), or import the key under such a "
            "name.",
            parameter="key_name",
            owner=OPTIONS_OWNER,
        )
    return name


def check_resume_from(uri: str) -> str:
    """``uri`` when it is ``s3://bucket/key`` with a valid bucket name and a key of at most 1024 printable characters
    (the module quotes it for the shell; a newline or another control character could not be)."""
    match = re.match(r"^s3://([^/]*)/(.+)$", uri) if isinstance(uri, str) else None
    bucket_ok = True
    if match:
        try:
            check_bucket_name(match.group(1))
        except ConfigError:
            bucket_ok = False
    if not match or not bucket_ok or not match.group(2).isprintable() or len(match.group(2).encode()) > 1024:
        raise refused(
            f"The 'resume_from' parameter of {OPTIONS_OWNER}",
            "the S3 URI of a checkpoint, s3://bucket/key, with a valid bucket name and a key of at most 1024 "
            "printable characters",
            uri,
            "The nodes fetch it from S3, e.g. s3://my-team-checkpoints/run-1/last.ckpt.",
            parameter="resume_from",
            owner=OPTIONS_OWNER,
        )
    return uri


def check_bucket_name(name: str, parameter: str = "bucket") -> str:
    """``name`` when it follows S3's bucket naming rules
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).

    Raises:
        ConfigError: naming the rule broken, the value and the fix.
    """
    why = None
    if not isinstance(name, str) or not _BUCKET.match(name):
        why = "must be 3 to 63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit"
    elif ".." in name:
        why = "must not have two adjacent dots"
    elif re.match(r"^\d+\.\d+\.\d+\.\d+$", name):
        why = "must not look like an IP address"
    elif name.startswith(_BUCKET_PREFIXES):
        why = "must not start with " + ", ".join(_BUCKET_PREFIXES)
    elif name.endswith(_BUCKET_SUFFIXES):
        why = "must not end with " + ", ".join(_BUCKET_SUFFIXES)
    if why:
        raise ConfigError(
            f"The {parameter} {name!r} is not a valid S3 bucket name: it {why} (S3's bucket naming rules). "
            "Give the name of an existing bucket, e.g. my-team-checkpoints.",
            parameter=parameter,
            value=name,
        )
    return name


def check_prefix(prefix: str, parameter: str = "checkpoint_prefix") -> str:
    """``prefix`` when it is folders of ``[A-Za-z0-9._-]`` each ending with ``/`` (none starting with a dot), at most
    512 characters: it reaches the instances' shell and their IAM policy, where ``*`` would be a wildcard.

    Raises:
        ConfigError: naming the value and the fix.
    """
    if not isinstance(prefix, str) or len(prefix) > 512 or not _PREFIX.match(prefix):
        raise ConfigError(
            f"The {parameter} {prefix!r} must be folders of letters, digits, '.', '_' and '-' (not starting with '.'), "
            "each ending with a slash, at most 512 characters, e.g. runs/resnet-1/.",
            parameter=parameter,
            value=prefix,
        )
    return prefix


def check_env_names(env: Mapping[str, object], parameter: str = "env") -> Mapping[str, object]:
    """``env`` when every name is a shell variable name ``[A-Z_][A-Z0-9_]*`` (it is exported on the instances).

    Raises:
        ConfigError: naming the first bad name.
    """
    for key in env:
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ConfigError(
                f"The environment variable name {key!r} in {parameter} is not [A-Z_][A-Z0-9_]*: only such names are "
                "exported on the instances. Rename it, e.g. SRIFTY_MY_SETTING.",
                parameter=parameter,
                value=key,
            )
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Secrets by name: NAME=ssm:/param or NAME=secretsmanager:id; the instances read the values at boot
# ---------------------------------------------------------------------------------------------------------------------

_SSM_PARAMETER = re.compile(r"^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")  # SSM parameter names (no ARN, no version)
_SECRET_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}$")
# names the instances' boot script, AWS's and NVIDIA's tools, torch and torchrun (which sets RANK, WORLD_SIZE,
# MASTER_ADDR... in every worker, over what the node exported, and takes PET_<ARGUMENT> for its arguments), OpenMP,
# Lightning or srifty itself rely on: a secret or a data folder exported under one of them would change what the node
# does, or never reach the job (the module's data validation holds the same pattern, and tests/infra/test_data.py
# every variable the boot script assigns to it)
RESERVED_ENV = (
    r"^(PATH|HOME|IFS|SHELL|USER|PWD|OLDPWD|HOSTNAME|TERM|LANG|LC_.*|TMPDIR|TOKEN|IMDS|REGION|STATE|JOB|CODE|LOG|LOG_URI|"
    r"URI|BOOT|ATTEMPTS|APT|BORN|CHECKPOINT_URI|DATA_HOME|DATA_JOBS|DEBIAN_FRONTEND|DEVICES|EFA_.*|ENDED|EXITED_URI|"
    r"EXPORTS|FS|GONE|HANDOVER|HOUSE|HUNG_.*|IMAGE|INSTANCE_ID|LAUNCHED|LIFE_.*|LISTED|LIVE|MY_IP|NET|NNODES|NVME|OFI|"
    r"OUTPUTS_.*|PEERS|PEERWATCH_PID|PER_BOOT|PICK|RAW|RDZV_HOST|RDZV_ID|READY_URI|REQ|SELF|SHIP_PID|STALLWATCH_PID|"
    r"TEE_PID|VENV|VERDICT|WAIT_UNTIL|WHY|WHEEL|WHEELHOUSE.*|LD_.*|BASH.*|AWS_.*|SRIFTY_.*|"
    r"PL_.*|LT_.*|TORCH_.*|TORCHELASTIC_.*|PET_.*|NCCL_.*|FI_.*|CUDA_.*|NVIDIA_.*|PYTHON.*|OMP_.*|MKL_.*|KMP_.*|RANK|"
    r"LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_NAME|ROLE_RANK|ROLE_WORLD_SIZE|"
    r"MASTER_ADDR|MASTER_PORT|NODE_RANK)$"
)
_RESERVED_ENV = re.compile(RESERVED_ENV)


def check_secret_env(specs: tuple[str, ...] | list[str], parameter: str = "secret_env") -> list[dict[str, str]]:
    """``NAME=ssm:/path/param`` and ``NAME=secretsmanager:secret-id`` (a name or an ARN) as the module's ``secrets``
    entries ``{"name", "source", "id"}``: names only, never values.

    Raises:
        ConfigError: naming the entry, what is wrong and the fix.
    """
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for spec in specs:
        name, _, ref = spec.partition("=") if isinstance(spec, str) else ("", "", "")
        source, _, ident = ref.partition(":")
        why = None
        if not _ENV_NAME.match(name):
            why = f"the variable name {name!r} is not [A-Z_][A-Z0-9_]*"
        elif _RESERVED_ENV.match(name):
            why = f"the variable name {name} is used by the instances' shell, AWS or srifty; pick another"
        elif name in seen:
            why = f"the variable name {name} is given twice"
        elif source == "ssm":
            if len(ident) > 2048 or not _SSM_PARAMETER.match(ident):
                why = f"{ident!r} is not an SSM parameter name (letters, digits, _ . - and /, e.g. /team/hf-token)"
        elif source == "secretsmanager":
            if not (_SECRET_NAME.match(ident) or _SECRET_ARN.match(ident)):
                why = f"{ident!r} is not a Secrets Manager secret name (letters, digits, / _ + = . @ -) or ARN"
        else:
            why = "the source must be ssm: (Parameter Store) or secretsmanager: (Secrets Manager)"
        if why:
            field = "{" + parameter + "}"  # the parameter's name, said by each front end
            raise ConfigError.between(
                f"{field} {{spec!r}}: {{why}}. Give NAME=ssm:/path/param or NAME=secretsmanager:secret-id, e.g. "
                f"{field} HF_TOKEN=ssm:/team/hf-token (the name of the secret, never its value).",
                parameter=parameter,
                value=spec,
                spec=spec,
                why=why,
            )
        seen.add(name)
        out.append({"name": name, "source": source, "id": ident})
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Training data by S3 folder, read-only: NAME=s3://bucket/prefix/, streamed (--data) or copied (--data-copy)
# ---------------------------------------------------------------------------------------------------------------------

# S3's bucket names and a folder of its safe characters and = + @ , (partitions such as year=2026/), ending with a
# slash: no * or ?, which the instance role's policy reads as wildcards, no $ (a policy variable). The module's
# variables.tf holds the same pattern (tests/infra/test_data.py compares them)
DATA_URI = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9!_.()'=+@,-]+/)*$"
_DATA_URI = re.compile(DATA_URI)
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$")


def check_data(
    streamed: tuple[str, ...] | list[str],
    copied: tuple[str, ...] | list[str] = (),
    taken: tuple[str, ...] = (),
) -> list[dict[str, object]]:
    """``NAME=s3://bucket/prefix/`` folders of training data as the module's ``data`` entries ``{"name", "uri",
    "copy"}``: ``streamed`` the job reads from S3 itself (NAME holds the URI), ``copied`` every node copies to its own
    disk before it is ready (NAME holds the local path). ``taken``: names already exported (the secrets).

    Raises:
        ConfigError: naming the entry, what is wrong and the fix.
    """
    out: list[dict[str, object]] = []
    seen = set(taken)
    for parameter, specs, copy in (("data", streamed, False), ("data_copy", copied, True)):
        for spec in specs:
            name, _, uri = spec.partition("=") if isinstance(spec, str) else ("", "", "")
            why = None
            if not _ENV_NAME.match(name):
                why = f"the variable name {name!r} is not [A-Z_][A-Z0-9_]*"
            elif _RESERVED_ENV.match(name):
                why = f"the variable name {name} is used by the instances' boot script, AWS, torchrun or srifty; "
                why += "pick another"
            elif name in seen:
                why = f"the variable name {name} is given twice (a secret or another data folder)"
            elif uri.startswith("s3://") and not uri.endswith("/") and _DATA_URI.match(uri + "/"):
                why = f"{uri!r} is not a folder: end it with a slash ({uri}/), as the role is granted the keys under it"
            elif len(uri) > 1024 or not _DATA_URI.match(uri):
                why = (
                    f"{uri!r} is not an S3 folder: s3://bucket/ or s3://bucket/prefix/, of letters, digits and "
                    "! _ . ( ) ' = + @ , - (no * or ?, which the instance role's policy reads as wildcards)"
                )
            if why:
                field = "{" + parameter + "}"
                raise ConfigError.between(
                    f"{field} {{spec!r}}: {{why}}. Give NAME=s3://bucket/prefix/, e.g. {field} "
                    "TRAIN_DATA=s3://team-datasets/imagenet/train/ (the fleet may read it, never write it).",
                    parameter=parameter,
                    value=spec,
                    spec=spec,
                    why=why,
                )
            seen.add(name)
            out.append({"name": name, "uri": uri, "copy": copy})
    return out


def check_kms_keys(arns: tuple[str, ...] | list[str], data: list[dict[str, object]]) -> list[str]:
    """The KMS key ARNs the data buckets encrypt with (``--data-kms-key``), each a key ARN (an alias cannot be granted),
    and only with data to read.

    Raises:
        ConfigError: naming the key and the fix.
    """
    _check_key_arns(arns, "data_kms_key")
    if arns and not data:
        raise ConfigError.between(
            "{data_kms_key} is for the buckets of {data} or {data_copy}: give the data folders too, or leave the "
            "key out.",
            parameter="data_kms_key",
            value=list(arns),
        )
    return list(dict.fromkeys(arns))


def check_secret_kms_keys(arns: tuple[str, ...] | list[str], secrets: list[dict[str, str]]) -> list[str]:
    """The customer-managed KMS key ARNs the ``--secret-env`` parameters and secrets encrypt with
    (``--secret-kms-key``), each a key ARN, and only with secrets to read. A SecureString parameter or a secret under
    AWS's own key (aws/ssm, aws/secretsmanager) needs none; under a key of your own, "any principal that retrieves the
    decrypted value must have kms:Decrypt permission on that key" (Systems Manager User Guide,
    https://docs.aws.amazon.com/systems-manager/latest/userguide/ps-restrict-decryption.html), and a secret of
    another account is always under one (Secrets Manager cannot share its AWS managed key across accounts).

    Raises:
        ConfigError: naming the key and the fix.
    """
    _check_key_arns(arns, "secret_kms_key")
    if arns and not secrets:
        raise ConfigError.between(
            "{secret_kms_key} is for the parameters and secrets of {secret_env}: give them too, or leave the key out.",
            parameter="secret_kms_key",
            value=list(arns),
        )
    return list(dict.fromkeys(arns))


def _check_key_arns(arns: tuple[str, ...] | list[str], parameter: str) -> None:
    for arn in arns:
        if not isinstance(arn, str) or not _KMS_KEY_ARN.match(arn):
            raise ConfigError.between(
                f"{{{parameter}}} {{arn!r}} is not a KMS key ARN: give arn:aws:kms:<region>:<account>:key/<key id> "
                "(an alias cannot be granted; aws kms describe-key of the alias prints its key's ARN).",
                parameter=parameter,
                value=arn,
                arn=arn,
            )
