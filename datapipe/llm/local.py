"""The local backend: a transformers causal LM on this machine's CPU (or its GPU).

Requests are grouped by their sampling settings, sorted by prompt length (less left padding)
and run `max_batch` at a time through one `generate()` call: on CPU a batch of 8 gives several
times the output tokens/s of one request at a time (bench/rephrase.py measures it), because
the weights are read once per step for the whole batch. A prompt that cannot fit the context
with its new tokens is answered `context_overflow` without running.
"""
from __future__ import annotations

from itertools import groupby

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, Completion, Request, failed, finish
from datapipe.llm.packaged import SMOLLM2, model_dir


class LocalBackend:
    name = "local"

    def __init__(self, cfg: BackendConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        folder = model_dir(cfg.model)
        self.model = "SmolLM2-135M-Instruct" if cfg.model == SMOLLM2 else folder.name
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.padding_side = "left"  # generation appends on the right
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32  # CPUs without AMX are fastest in fp32
        self.lm = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(self.device).eval()
        self.context = cfg.max_context or self.lm.config.max_position_embeddings

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def generate(self, requests: list[Request]) -> list[Completion]:
        prompts = [self.tokenizer.apply_chat_template(r.messages, tokenize=False, add_generation_prompt=True)
                   for r in requests]
        lengths = self.count_tokens(prompts)
        results: list[Completion | None] = [None] * len(requests)
        runnable = []
        for i, (request, length) in enumerate(zip(requests, lengths)):
            if length + request.max_new_tokens > self.context:
                results[i] = failed(CONTEXT_OVERFLOW, f"{length} prompt + {request.max_new_tokens} new tokens "
                                                      f"> {self.context}-token context")
            else:
                runnable.append(i)
        settings = lambda i: (requests[i].temperature, requests[i].top_p)  # noqa: E731
        for _, group in groupby(sorted(runnable, key=lambda i: (settings(i), lengths[i])), key=settings):
            group = list(group)
            for start in range(0, len(group), self.cfg.max_batch):
                batch = group[start : start + self.cfg.max_batch]
                for i, completion in zip(batch, self.generate_batch([prompts[i] for i in batch],
                                                                    [requests[i] for i in batch])):
                    results[i] = completion
        return results

    def generate_batch(self, prompts: list[str], requests: list[Request]) -> list[Completion]:
        """One generate() call; every request in it shares temperature and top_p."""
        import torch

        first = requests[0]
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        sampling = {"do_sample": True, "temperature": first.temperature, "top_p": first.top_p} \
            if first.temperature > 0 else {"do_sample": False}
        torch.manual_seed(self.cfg.seed)
        with torch.inference_mode():
            out = self.lm.generate(**encoded, max_new_tokens=max(r.max_new_tokens for r in requests),
                                   pad_token_id=self.tokenizer.pad_token_id, **sampling)
        new = out[:, encoded["input_ids"].shape[1] :].tolist()
        return [self.decode(ids[: r.max_new_tokens], r.max_new_tokens) for ids, r in zip(new, requests)]

    def decode(self, ids: list[int], limit: int) -> Completion:
        eos = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        end = next((k for k, token in enumerate(ids) if token in eos), None)
        kept = ids if end is None else ids[:end]
        reason = "stop" if end is not None or len(kept) < limit else "length"
        return finish(self.tokenizer.decode(kept, skip_special_tokens=True), len(kept), reason)
