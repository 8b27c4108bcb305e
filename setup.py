"""Build hook: ship the reviewed Terraform (``terraform/root`` and ``terraform/modules/training_fleet``) inside the
package as ``lightning_srifty/provision/_terraform``, so that ``srifty terraform`` works from a wheel.

``terraform/`` stays the one source of truth: nothing is copied in the repository, only into the build folder (an
editable install reads ``terraform/`` itself). All other settings are in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("root", "modules/training_fleet")  # the examples stay in the repository


class BuildPyWithTerraform(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        source = Path(__file__).resolve().parent / "terraform"
        target = Path(self.build_lib) / "lightning_srifty" / "provision" / "_terraform"
        for folder in SHIPPED:
            shutil.copytree(
                source / folder,
                target / folder,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(".*", "*.tfstate*", "*.tfplan", "tfplan"),
            )


setup(cmdclass={"build_py": BuildPyWithTerraform})
