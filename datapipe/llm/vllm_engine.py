"""The vLLM backend: vLLM's offline engine inside the rephrase stage's Ray actors, one per GPU.

This is the layout Ray Data's LLM processor (`ray.data.llm.vLLMEngineProcessorConfig`) builds:
a pool of warm engines, each fed large batches that vLLM schedules with continuous batching and
paged attention. We keep the engine inside our own stage rather than a processor pass because
chunk-wise rewriting needs several dependent generation rounds per document (chunk k's prompt
holds the rewrite of chunk k-1), while a processor pass answers one prompt per row. Set the
stage's `num_gpus: 1` and `concurrency: <GPUs>`; `backend.model` is a transformers folder
(the packaged SmolLM2 converts to one, see datapipe.llm.packaged) or any model vLLM can load.
"""
from __future__ import annotations

from datapipe.llm.base import CONTEXT_OVERFLOW, BackendConfig, BackendError, Completion, Request, failed, finish
from datapipe.llm.packaged import SMOLLM2, model_dir


class VLLMBackend:
    name = "vllm"

    def __init__(self, cfg: BackendConfig):
        try:
            from vllm import LLM
        except ImportError:
            raise BackendError("backend vllm needs vLLM on a CUDA machine: pip install vllm "
                               "(a GPU node; on CPU use backend.type: local)") from None
        folder = model_dir(cfg.model)
        self.cfg = cfg
        self.model = "SmolLM2-135M-Instruct" if cfg.model == SMOLLM2 else folder.name
        self.engine = LLM(model=str(folder), dtype=cfg.dtype, seed=cfg.seed, max_model_len=cfg.max_context,
                          gpu_memory_utilization=cfg.gpu_memory_utilization)
        self.tokenizer = self.engine.get_tokenizer()
        self.context = self.engine.llm_engine.model_config.max_model_len

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def generate(self, requests: list[Request]) -> list[Completion]:
        from vllm import SamplingParams

        results: list[Completion | None] = [None] * len(requests)
        runnable = []
        for i, request in enumerate(requests):
            length = len(self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True))
            if length + request.max_new_tokens > self.context:
                results[i] = failed(CONTEXT_OVERFLOW, f"{length} prompt + {request.max_new_tokens} new tokens "
                                                      f"> {self.context}-token context")
            else:
                runnable.append(i)
        params = [SamplingParams(temperature=requests[i].temperature, top_p=requests[i].top_p,
                                 max_tokens=requests[i].max_new_tokens, seed=self.cfg.seed) for i in runnable]
        outputs = self.engine.chat([requests[i].messages for i in runnable], params, use_tqdm=False) if runnable else []
        for i, output in zip(runnable, outputs):
            best = output.outputs[0]
            results[i] = finish(best.text, len(best.token_ids), best.finish_reason or "")
        return results
