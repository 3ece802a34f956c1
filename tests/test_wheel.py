"""A non-editable install holds the whole library: a wheel built from the source, installed into a fresh virtual
environment away from the source tree, imports every subpackage.

The wheel is built from a copy of the package's files (``pyproject.toml``, ``README.md``, ``specdec_core/``), so the
build leaves nothing in the checkout. The new environment reads its dependencies (torch, transformers, …) from this
environment's site-packages through a path file, which adds the folder to ``sys.path`` without running that folder's
own path files (among them the editable install's finder, which would import the source tree instead of the wheel).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "specdec_core").rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def build_wheel(tmp: Path, pyproject: str | None = None) -> Path:
    """A wheel of the package (``pyproject``: that text in place of the checkout's ``pyproject.toml``)."""
    src = tmp / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(pyproject or (ROOT / "pyproject.toml").read_text())
    shutil.copy2(ROOT / "README.md", src / "README.md")
    shutil.copytree(ROOT / "specdec_core", src / "specdec_core", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp / "dist").glob("specdec_core-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_every_subpackage(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in PACKAGES if p.replace(".", "/") + "/__init__.py" not in names]
    assert len(PACKAGES) >= 6 and not missing, f"not in the wheel: {missing}"


def test_an_install_without_the_source_imports_every_subpackage(wheel, tmp_path):
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    zipfile.ZipFile(wheel).extractall(site)  # what pip does with a pure-Python wheel, less the record
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = ("import importlib, sys, specdec_core\n"
            f"mods = {PACKAGES!r}\n"
            "for m in mods: importlib.import_module(m)\n"
            "print(specdec_core.__file__)")
    out = tmp_path / "elsewhere"
    out.mkdir()
    proc = subprocess.run([str(py), "-c", code], cwd=out, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith(str(site)), f"imported from {proc.stdout.strip()}, not the wheel"


def test_the_check_fails_without_find(tmp_path):
    """The planted bad layout (the old ``packages = ["specdec_core"]``) is caught: its wheel lacks the subpackages."""
    text = (ROOT / "pyproject.toml").read_text()
    find = '[tool.setuptools.packages.find]\ninclude = ["specdec_core*"]'
    assert find in text
    wheel = build_wheel(tmp_path, text.replace(find, '[tool.setuptools]\npackages = ["specdec_core"]'))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specdec_core/__init__.py" in names and "specdec_core/study/__init__.py" not in names
