"""OpenAI's Responses API (Codex): structs, conversion to chat, typed stream events."""
