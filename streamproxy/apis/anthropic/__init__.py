"""Anthropic's Messages API (Claude Code): structs, conversion to chat, events, error shape."""
