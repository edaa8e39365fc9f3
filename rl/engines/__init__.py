"""Inference engines behind one protocol (`base.Engine`).

Transformers in process, vLLM colocated with the trainer, any OpenAI-compatible server.
"""
