"""`llmctl serve`: the generation engine behind an OpenAI-compatible HTTP API.

    model     the checkpoint or exported folder, loaded with its tokenizer and chat template
    protocol  OpenAI's request bodies, checked, as Jobs; its response and stream-chunk shapes
    text      a sample's streamed text deltas (held back at a possible stop string or split character)
    worker    the engine thread: the one owner of the Scheduler, fed through a queue
    app       the Starlette app: routes, handlers, streaming, errors
    server    binding, uvicorn, signals
"""
