"""specdec_core.study.blas: the MKL setting is chosen on import, and a caller's own setting wins."""
import json
import os
import subprocess
import sys

import pytest

from specdec_core.study import blas

PROBE = ("import os, specdec_core as sd; from specdec_core.study import blas; "
         "print(repr(os.environ.get('MKL_CBWR')), blas.mode())")


def _run(env_value):
    env = {k: v for k, v in os.environ.items() if k != blas.VAR}
    if env_value is not None:
        env[blas.VAR] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize("given, seen, mode", [(None, "'AUTO'", "AUTO"), ("", "''", "MKL"),
                                               ("AVX2", "'AVX2'", "AVX2")])
def test_import_sets_default_unless_caller_did(given, seen, mode):
    got = _run(given)
    assert got[0] == seen and got[1] == mode


def test_compare_paths_reports_ratios_against_one_token():
    """The parent side of compare_paths, with the subprocess replaced by a canned timing line."""
    def fake_run(cmd, env, **kw):
        scale = 1.0 if env[blas.VAR] else 2.0  # MKL default: every T > 1 twice as dear
        args = json.loads(cmd[-1])
        rows = [dict(what="pass", T=T, median=0.05 * (1 if T == 1 else scale) / max(n, 1), q25=0, q75=0, threads=n)
                for n in args["threads"] for T in args["token_counts"]]
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(rows) + "\n", stderr="")

    df = blas.compare_paths(token_counts=[5, 2], run=fake_run)
    # the kernel's setting, where it builds here, asks the subprocess for the kernel; MKL's settings for torch's path
    envs = []
    blas.compare_paths(token_counts=[2], run=lambda cmd, env, **kw: envs.append(env) or fake_run(cmd, env, **kw))
    assert [e[blas.kernels.ENV] for e in envs][:2] == ["torch", "torch"]
    assert len(envs) == 2 + (blas.kernels.load() is not None) and envs[-1][blas.kernels.ENV] in ("torch", "rows")
    assert sorted(df["T"].unique()) == [1, 2, 5] and set(df.threads) == {0}
    r = df.set_index(["setting", "T"])["ratio"]
    assert r[("MKL default", 5)] == 2.0 and r[("MKL_CBWR=AUTO", 5)] == 1.0 and r[("MKL default", 1)] == 1.0
    # several thread counts in one subprocess per setting; each ratio is against t(1) at its own thread count
    calls = []
    df = blas.compare_paths(token_counts=[5], threads=[1, 2], run=lambda cmd, env, **kw: calls.append(1) or
                            fake_run(cmd, env, **kw))
    assert len(calls) == df.setting.nunique() >= 2 and sorted(df.threads.unique()) == [1, 2]
    r = df.set_index(["setting", "threads", "T"])["ratio"]
    assert r[("MKL default", 2, 5)] == r[("MKL default", 1, 5)] == 2.0 and r[("MKL_CBWR=AUTO", 2, 5)] == 1.0
    with pytest.raises(ValueError, match="threads must be a count"):
        blas.compare_paths(threads=[-1], run=fake_run)


def test_compare_paths_names_a_failed_setting():
    def failing(cmd, env, **kw):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="boom")

    with pytest.raises(RuntimeError, match="(?s)MKL_CBWR=''.*boom"):
        blas.compare_paths(token_counts=[1], run=failing)
