"""Tessera's data plane: the inference engine and the worker that serves it."""

from dataplane.engine.llm import LLM
from dataplane.outputs import CompletionOutput, RequestOutput
from dataplane.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
