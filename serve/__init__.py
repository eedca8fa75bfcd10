"""`fusedspec serve`: an OpenAI-compatible HTTP server for one published cpu version, one file per job.

    source.py    the version as local files: a directory (a pod's mount) as it is, an s3:// version synced
                 into the cache dir; then `registry.verify` against its manifest (no verify, no serving)
    text.py      the artifact's tokenizer: prompts and chat messages to token ids, token ids back to text
    engine.py    one thread owns the runner's ContinuousBatcher: admission control, steps, cancellation
    metrics.py   the Prometheus metrics the engine and the routes record
    protocol.py  the request and response bodies of the OpenAI API subset served (pydantic)
    app.py       the FastAPI app: /v1/completions, /v1/chat/completions (SSE streaming), /v1/models,
                 /health, /ready, /metrics
"""
