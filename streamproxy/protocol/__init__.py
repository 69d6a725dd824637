"""OpenAI's wire structs (msgspec): chat, completions, embeddings, tokenize.

Decoders and encoders are built once at import. Sans-IO; imports only msgspec
and `streamproxy.errors`. Foreign APIs keep theirs in `streamproxy.apis`.
"""
