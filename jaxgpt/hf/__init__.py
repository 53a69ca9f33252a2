"""Hugging Face checkpoints <-> jaxgpt, one family a module: GPT2LMHeadModel (gpt2.py),
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (llama.py),
MixtralForCausalLM (mixtral.py), Gemma 3's text model (gemma.py), the encoder BertForMaskedLM
(bert.py) and the encoder–decoder BartForConditionalGeneration (bart.py). Each is a `Family`
(family.py) of four functions between its files and jaxgpt's model; the layers they share
(layers.py), reading a folder (files.py) and the conversion itself (convert.py) are written once.

    config, params, family = load_pretrained("path/to/dir")   # or a Hub name such as "gpt2", online
    save_pretrained(config, params, "out/dir")                # safetensors + config.json for transformers

Weights are read and written with safetensors' numpy API, so converting needs neither torch nor
transformers (the parity tests, tests/test_hf.py, use them as the reference).
"""

from jaxgpt.hf.convert import (
    FAMILIES,
    check_folder,
    family_of,
    load_pretrained,
    pretrained_config,
    pretrained_tokenizer,
    save_pretrained,
)

__all__ = [
    "FAMILIES",
    "check_folder",
    "family_of",
    "load_pretrained",
    "pretrained_config",
    "pretrained_tokenizer",
    "save_pretrained",
]
