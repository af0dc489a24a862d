"""The local backend: a transformers causal LM on this machine's CPU (or its GPU).

Requests are sorted by prompt length (less left padding) and run `max_batch` at a time through
one `generate()` call, each row with its own temperature, top_p and token limit
(datapipe.llm.sampling). Batching multiplies output tokens/s because every decoding step reads
the weights and pays Python's per-step overhead once for the whole batch: bench/rephrase.py
measures it on CPU and on an H200. A prompt that cannot fit the context
with its new tokens is answered `context_overflow` without running.
"""
from __future__ import annotations

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, Completion, Request, failed, finish
from datapipe.llm.packaged import SMOLLM2, model_dir, quiet_loading


class LocalBackend:
    name = "local"

    def __init__(self, cfg: BackendConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        quiet_loading()
        self.cfg = cfg
        self.device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        folder = model_dir(cfg.model)
        self.model = "SmolLM2-135M-Instruct" if cfg.model == SMOLLM2 else folder.name
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.padding_side = "left"  # generation appends on the right
        if self.tokenizer.pad_token is None:  # some transformers versions convert the GGUF without one
            self.tokenizer.pad_token = self.tokenizer.eos_token
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
        runnable.sort(key=lambda i: lengths[i])  # neighbours in length: little left padding
        for start in range(0, len(runnable), self.cfg.max_batch):
            batch = runnable[start : start + self.cfg.max_batch]
            for i, completion in zip(batch, self.generate_batch([prompts[i] for i in batch],
                                                                [requests[i] for i in batch])):
                results[i] = completion
        return results

    def generate_batch(self, prompts: list[str], requests: list[Request]) -> list[Completion]:
        """One generate() call; each row keeps its own temperature, top_p and token limit."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from datapipe.llm.sampling import RowLimits, RowSampling

        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        prompt_len = encoded["input_ids"].shape[1]
        limits = [r.max_new_tokens for r in requests]
        rows = RowSampling([r.temperature for r in requests], [r.top_p for r in requests], self.device)
        torch.manual_seed(self.cfg.seed)
        with torch.inference_mode():
            out = self.lm.generate(**encoded, max_new_tokens=max(limits), pad_token_id=self.tokenizer.pad_token_id,
                                   do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                   logits_processor=LogitsProcessorList([rows]),
                                   stopping_criteria=StoppingCriteriaList([RowLimits(prompt_len, limits, self.device)]))
        new = out[:, prompt_len:].tolist()
        return [self.decode(ids[:limit], limit) for ids, limit in zip(new, limits)]

    def decode(self, ids: list[int], limit: int) -> Completion:
        eos = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        end = next((k for k, token in enumerate(ids) if token in eos), None)
        kept = ids if end is None else ids[:end]
        reason = "stop" if end is not None or len(kept) < limit else "length"
        return finish(self.tokenizer.decode(kept, skip_special_tokens=True), len(kept), reason)
