"""``python -m specdec_core.tools.cpu_kernel [model]`` (``make kernels``): build the CPU verify kernel and calibrate it on a target (the embedded
one by default), alone, before anything runs beside it; prints the verdict that later loads read from the cache.
``--again`` drops the cached calibration first."""
import argparse
import os

from ..kernels import ENV, build_dir, load

parser = argparse.ArgumentParser(prog="python -m specdec_core.tools.cpu_kernel", description=__doc__)
parser.add_argument("model", nargs="?", default="smollm2-135m")
parser.add_argument("--again", action="store_true", help="calibrate again, dropping the cached verdict")
args = parser.parse_args()
os.environ[ENV] = "auto"
if load() is not None and args.again:
    for f in build_dir().glob("calibration-*.json"):
        f.unlink()
from ..models import load_pair  # noqa: E402

load_pair(args.model)
