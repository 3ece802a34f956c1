"""environment.yml and pyproject.toml pin the same versions."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_pins_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_list = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = lambda items: {m.group(1).lower(): m.group(2) for s in items if (m := re.match(r"([\w.-]+)==(\S+)$", s))}
    a, b = pins(project), pins(pip_list)
    assert a, "pyproject.toml pins nothing"
    assert all("==" in d for d in project), "every dependency must be pinned exactly"
    assert a == b
