"""What the tests and the benchmarks both run: servers as processes, and the fakes and tools around them.

    process       ServerProcess: a child on 127.0.0.1, its output in files, ready, stopped; free_port, ServerFailed
    server        `streamproxy serve|gateway` and vLLM's own server: launch, start_server, serve_process, start_gateway,
                  vllm_process, fake_server; the engine flags (ENGINE_ARGS, VLLM_ENGINE_ARGS, FAKE_ARGS)
    procs         which processes a server started, which are left, which listen on its port
    waiting       wait_until (async) and wait_until_sync
    postgres      a real PostgreSQL server from pgserver's binaries
    fake_kube     a fake Kubernetes API server
    kv_publisher  a fake vLLM replica's prefix cache and KV-event publisher
    lmeval        lm-evaluation-harness against a server, and two runs compared

It imports neither `tests` nor `bench` (tests/unit/test_layers.py): both import it, and the
benchmarks import nothing from `tests` (whose conftest sets an environment variable and an
atexit hook on import).
"""
