"""`python -m streamproxy serve ...` (vLLM's engine core is spawned, so the entry
point sits under the main guard)."""

from streamproxy.cli import main

if __name__ == "__main__":
    main()
