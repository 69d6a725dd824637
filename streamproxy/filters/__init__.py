"""Response filters: per-choice transforms between the engine's text and the encoders.

`base` defines the parts and the protocol, `chain` picks the filters of a
request, `registry` the parsers a flag may name (ours, and those an engine
adds: vLLM's adapters join it from engine_adapter, which this package never
imports); one module per behaviour (tool-call parsers, constrained tool-call
emitters, reasoning splitters).
"""
