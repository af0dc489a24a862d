"""Per-row sampling settings and token limits for one transformers generate() call.

generate() takes one temperature, one top_p and one max_new_tokens for the whole batch, so a
round whose requests use several styles would split into one call per setting, each waiting
for its longest row. These two hooks let every row keep its own: RowSampling scales and
truncates each row's logits (temperature 0 keeps only the argmax, i.e. greedy), RowLimits
stops each row at its own limit. With them a rephrase round is one call per `max_batch`
(about 4x fewer calls for the K2 style library, whose styles use 4 temperatures).
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessor, StoppingCriteria


class RowSampling(LogitsProcessor):
    def __init__(self, temperatures: list[float], top_ps: list[float], device):
        self.temperature = torch.tensor(temperatures, device=device).unsqueeze(1)
        self.top_p = torch.tensor(top_ps, device=device).unsqueeze(1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float()
        greedy = self.temperature == 0
        scaled = scores / torch.where(greedy, torch.ones_like(self.temperature), self.temperature)
        ordered, order = scaled.sort(dim=-1)  # ascending: the tail to cut comes first
        tail = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
        tail[:, -1] = False  # the most likely token always stays
        scaled = scaled.masked_fill(tail.scatter(1, order, tail), float("-inf"))
        argmax_only = scores < scores.max(dim=-1, keepdim=True).values
        return scaled.masked_fill(greedy & argmax_only, float("-inf"))


class RowLimits(StoppingCriteria):
    """Done per row once it has its own max_new_tokens (generate pads finished rows)."""

    def __init__(self, prompt_len: int, limits: list[int], device):
        self.prompt_len = prompt_len
        self.limits = torch.tensor(limits, device=device)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids.shape[1] - self.prompt_len) >= self.limits
