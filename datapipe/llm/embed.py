"""Sentence embeddings for the fidelity gate: all-MiniLM-L6-v2, loaded offline from its package.

The model is a 6-layer BERT (22M parameters, 384 dims); sentence-transformers' recipe for it is
mean pooling over the non-padding tokens and L2 normalization, done here in a few lines so that
sentence-transformers (and its scikit-learn/scipy tail) need not be installed. Inputs longer
than 256 word pieces are cut, as the model was trained (a 256-token chunk fits).
"""
from __future__ import annotations

from pathlib import Path

MAX_TOKENS = 256  # the model's max_seq_length
BATCH = 32  # texts per forward pass


class Embedder:
    def __init__(self, folder: Path | None = None, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        from datapipe.llm.packaged import minilm_dir, quiet_loading

        quiet_loading()
        folder = folder or minilm_dir()
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()

    def encode(self, texts: list[str]):
        """Unit vectors, one row per text (a float32 torch tensor)."""
        import torch

        rows = []
        for start in range(0, len(texts), BATCH):
            batch = self.tokenizer(texts[start : start + BATCH], padding=True, truncation=True,
                                   max_length=MAX_TOKENS, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu())
        return torch.cat(rows) if rows else torch.zeros((0, 384))

    def cosine(self, sources: list[str], rewrites: list[str]) -> list[float]:
        """Cosine similarity of each source with its rewrite, pair by pair."""
        if not sources:
            return []
        vectors = self.encode(list(sources) + list(rewrites))
        left, right = vectors[: len(sources)], vectors[len(sources) :]
        return [round(float(x), 4) for x in (left * right).sum(-1)]
