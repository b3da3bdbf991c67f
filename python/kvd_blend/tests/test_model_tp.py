"""Unit tests of model.py's tensor-parallel helpers (no vLLM engine needed)."""

from __future__ import annotations

import importlib

import torch


def _model(monkeypatch, fault: str, while_file: str = ""):
    monkeypatch.setenv("KVD_BLEND_FAULT", fault)
    monkeypatch.setenv("KVD_BLEND_FAULT_WHILE", while_file)
    import kvd_blend.model as m

    return importlib.reload(m)


def test_fault_on_every_rank_or_on_one_rank(monkeypatch):
    m = _model(monkeypatch, "check_layer")
    assert m._fault_here("check_layer", 0) and m._fault_here("check_layer", 1)
    m = _model(monkeypatch, "check_layer@1")
    assert not m._fault_here("check_layer", 0)
    assert m._fault_here("check_layer", 1)
    assert not m._fault_here("other", 1)
    m = _model(monkeypatch, "")
    assert not m._fault_here("check_layer", 0)
    m = _model(monkeypatch, "check_layer@x")
    assert not m._fault_here("check_layer", 0)


def test_fault_fires_only_while_its_file_exists(monkeypatch, tmp_path):
    switch = tmp_path / "fail-now"
    m = _model(monkeypatch, "check_layer@1", str(switch))
    assert not m._fault_here("check_layer", 1)
    switch.touch()
    assert m._fault_here("check_layer", 1)
    assert not m._fault_here("check_layer", 0)  # still rank 1 only
    switch.unlink()
    assert not m._fault_here("check_layer", 1)


def test_without_a_tensor_parallel_group_one_rank_and_sum_is_the_identity(monkeypatch):
    m = _model(monkeypatch, "")
    tp = m._TensorParallel()
    assert (tp.size, tp.rank) == (1, 0)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(tp.sum(t), t)
