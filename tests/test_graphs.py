"""``StepGraphs`` in mode "graph" on a stand-in for CUDA (``StepGraphs.cuda``, on the CPU): a capture that fails
leaves CUDA's sync-debug mode as it found it, whatever the error; a RuntimeError makes the key run uncaptured, with
a warning; any other error propagates, nothing recorded."""
from __future__ import annotations

import contextlib

import pytest
import torch

from specdec_core.graphs import StepGraphs


class _Stream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other) -> None:
        pass


class _Graph:
    """Counts its replays (a real graph's replay reruns the captured kernels, rewriting the output buffer)."""

    def __init__(self):
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class _FakeCuda:
    """The calls :meth:`StepGraphs._capture` makes of ``torch.cuda``; the sync-debug mode is ``mode`` (0 default,
    1 warn, 2 error, as torch numbers them)."""

    Stream = _Stream
    CUDAGraph = _Graph

    def __init__(self, mode: int = 0):
        self.mode = mode

    def current_stream(self, device=None) -> _Stream:
        return _Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def graph(self, g):
        return contextlib.nullcontext()

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode) -> None:
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)


def _graph_steps(cuda: _FakeCuda) -> StepGraphs:
    """A StepGraphs in mode "graph" on the CPU (its constructor refuses a non-CUDA device), capturing on ``cuda``."""
    g = object.__new__(StepGraphs)
    g.mode, g.device, g.captured, g.uncaptured, g.cuda = "graph", torch.device("cpu"), {}, {}, cuda
    return g


@pytest.mark.parametrize("before", [0, 1])
def test_an_error_other_than_runtime_error_restores_the_sync_debug_mode_and_propagates(before):
    cuda, seen = _FakeCuda(before), []

    def fn():
        seen.append(cuda.mode)
        raise KeyError("a bug in the step")

    g = _graph_steps(cuda)
    with pytest.raises(KeyError, match="a bug in the step"):
        g.run("key", fn)
    assert seen == [2]  # the warm-up ran with host synchronization refused ("error")
    assert cuda.mode == before
    assert g.uncaptured == {} and g.captured == {}  # not a capture that failed: nothing recorded


def test_a_runtime_error_restores_the_mode_and_the_key_runs_uncaptured():
    cuda, seen = _FakeCuda(1), []

    def fn():
        seen.append(cuda.mode)
        if cuda.mode == 2:
            raise RuntimeError("called a synchronizing CUDA operation\nmore lines")
        return torch.ones(2)

    g = _graph_steps(cuda)
    with pytest.warns(UserWarning, match="called a synchronizing CUDA operation"):
        out = g.run("key", fn)
    assert torch.equal(out, torch.ones(2)) and seen == [2, 1]  # the warm-up refused, then one uncaptured call
    assert cuda.mode == 1
    assert g.uncaptured == {"key": "called a synchronizing CUDA operation"} and g.captured == {}


def test_a_capture_restores_the_mode_and_replays():
    cuda, buf = _FakeCuda(1), torch.zeros(2)

    def fn():
        buf.add_(1)
        return buf

    g = _graph_steps(cuda)
    out = g.run("key", fn)
    assert cuda.mode == 1 and g.uncaptured == {}
    graph, captured_out = g.captured["key"]
    assert captured_out is buf and out is not buf and graph.replays == 1  # replayed once, its output copied out
    assert float(out[0]) == StepGraphs.WARMUPS + 1  # the warm-ups, then the capture, each ran fn once
