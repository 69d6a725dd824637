"""Response filters: per-choice transforms between the engine's text and the encoders.

`base` defines the parts and the protocol, `chain` picks the filters of a
request; one module per behaviour (tool-call parsers, constrained tool-call
emitters, the adapter to vLLM's parser registry).
"""
