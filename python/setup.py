"""Copies the built libpagoda next to the package when installing (see pyproject.toml)."""
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        env = os.environ.get("PAGODA_LIBRARY")
        for cand in ([Path(env)] if env else []) + [here.parent / "build" / "libpagoda.so"]:
            if cand.is_file():
                dst = Path(self.build_lib) / "pagoda" / "libpagoda.so"
                shutil.copy2(cand, dst)
                print(f"pagoda: bundled {cand}")
                return
        print("pagoda: no libpagoda.so found (set PAGODA_LIBRARY at run time)")


setup(cmdclass={"build_py": BuildPyWithLibrary})
