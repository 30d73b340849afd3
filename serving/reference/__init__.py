"""spectune's reference engine: a small speculative-decoding LLM server with SGLang's interface.

Start it like ``sglang.launch_server`` (``python -m serving.reference --model-path ref-tiny ...``);
it serves SGLang's endpoints and metric names. See docs/reference-engine.md.
"""
