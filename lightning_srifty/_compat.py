"""Old module paths (before the sub-packages) keep working for one release, with a ``DeprecationWarning``.

``import lightning_srifty.callback`` gives the module now at ``lightning_srifty.profiling.callback`` itself (not a
copy), so monkeypatching and ``isinstance`` see one thing (:class:`predictor.MovedModules`, which does the same for
the predictor's own old paths). Installed by ``lightning_srifty/__init__.py``.
"""

from __future__ import annotations

from predictor import MovedModules

# old -> new (under lightning_srifty); removed in 0.3
MOVED = {
    "callback": "profiling.callback",
    "recorder": "profiling.recorder",
    "clock": "timing",
    "profiling.clock": "timing",  # 0.2's home: shared by profiling and ddp now, so neither imports the other for it
    "assemble": "profiling.assemble",
    "flops": "profiling.flops",
    "model_info": "profiling.model_info",
    "hardware": "profiling.hardware",
    "capture": "profiling.capture",
    "ops_capture": "profiling.ops_capture",
    "cuda_autocast": "profiling.cuda_autocast",
    "strategy": "strategies.ddp",
    "hetero": "strategies.hetero",
    "preemption": "migrate.preemption",
    "spot_watcher": "migrate.spot_watcher",
    "triggers": "migrate.triggers",
    "migrate.imds": "imds",  # 0.2's home: profiling (the instance type) and migrate (spot notices) share it
    "markers": "protocol",
    "imds_sim": "provision.aws",
    "launch": "provision.launcher.launch",
    "report": "console",
    "cli_capture": "cli.capture",
    "cli_catalog": "cli.catalog",
    "cli_eval": "cli.eval",
    "cli_launch": "cli.launch",
    "cli_predict": "cli.predict",
    "cli_recommend": "cli.recommend",
    "cli_serve": "cli.serve",
    "cli_terraform": "cli.terraform",
    # 0.3: provision/ by concept (issue #39): the Terraform writer, the launcher, the fleet operations
    "provision.generate": "provision.terraform.generate",
    "provision.snapshot": "provision.terraform.snapshot",
    "provision.bootstrap": "provision.terraform.bootstrap",
    "provision.cuda": "provision.terraform.cuda",
    "provision.command": "provision.terraform.command",
    "provision.money": "provision.terraform.money",
    "provision.runner": "provision.apply",
    "provision.fleets": "provision.operations.fleets",
    "provision.logs": "provision.operations.logs",
    "provision.launch": "provision.launcher.launch",
    "provision.spot_guard": "provision.launcher.spot_guard",
    "provision.signals": "provision.base",
    "provision.local": "provision.launcher.local",
    "provision.terraform_fleet": "provision.launcher.terraform_fleet",
    "provision.imds_sim": "provision.aws",
    # 0.3: every strategy in one folder (issue #39); the all-reduce timer, shared by the profiler and srifty_ddp,
    # and the launch's checks of the Trainer, read by the profiler and SpotPreemption, below them
    "ddp": "strategies",
    "ddp.strategy": "strategies.ddp",
    "ddp.fsdp": "strategies.fsdp",
    "ddp.hetero": "strategies.hetero",
    "ddp.nodes": "strategies.nodes",
    "ddp.teardown": "teardown",
    "strategies.teardown": "teardown",  # 0.3: shared by the strategies and migrate's FabricPreemption
    "ddp.plan_strategy": "strategies.plan_strategy",
    "ddp.comm": "comm",
    "migrate.plan": "strategies.planned",
}
PACKAGE = "lightning_srifty"


def install() -> None:
    MovedModules(PACKAGE, MOVED).install()
