"""On a GPU: the pure-torch core captured in a CUDA graph replays each step's budgets exactly."""

import pytest
import torch
from core_helpers import make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 16, 64, 8, 128


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["base_plus", "base", "gate_sum", "oea", "frequency"])
def test_core_selection_replays_in_a_cuda_graph(policy):
    dev = torch.device("cuda")
    logits, ids, w = make_routing(T, E, K)
    logits, ids, w = logits.to(dev), ids.to(dev), w.to(dev)
    hidden = torch.randn(T, H, device=dev)
    pred = make_predictor(E, H, K).to(dev)
    cfg = SelectionConfig(policy=policy)
    budget = torch.full((T,), E, dtype=torch.int64, device=dev)  # static buffer, refilled per step
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the graph
            select_experts(logits, ids, w, hidden, budget, 0, cfg, pred)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = select_experts(logits, ids, w, hidden, budget, 0, cfg, pred)
    for step in ([E] * T, [3] * T, [8, -1] * (T // 2), [1] * T, [2, 12] * (T // 2)):
        budget.copy_(torch.tensor(step, device=dev))
        graph.replay()
        ref = select_experts(logits, ids, w, hidden, budget.clone(), 0, cfg, pred)
        assert torch.equal(out.ids, ref.ids)
        assert torch.equal(out.weights, ref.weights)
        assert torch.equal(out.stats.num_kept, ref.stats.num_kept)
