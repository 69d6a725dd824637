"""The real-engine fixtures (`engine_server`, `model_name`) live in tests/conftest.py,
shared with tests/compat so one engine serves the whole session."""
