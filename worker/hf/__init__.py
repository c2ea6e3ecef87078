"""Hugging Face Llama checkpoints in and out: name and rotary-layout conversion (convert.py),
loading safetensors into any parallel layout (load.py), exporting a DCP checkpoint as a
Hugging Face folder (export.py). The service never imports this package (it reads only
config.json, through contract/hf_config.py)."""
