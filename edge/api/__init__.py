"""The edge's local OpenAI-compatible HTTP API (`acespec edge serve`):

    app.py           the Starlette app, routes, metrics, serve() under uvicorn
    service.py       EdgeService: requests to engine runs (concurrency, drafter sequences)
    guard.py         ApiGuard: Origin/Host/content-type/size/API-key checks before any route
    openai_types.py  request parsing and validation, response bodies
    params.py        which request fields are honoured, accepted only when off, or refused
    messages.py      chat messages: roles, content as a string or text parts
    errors.py        ApiError (OpenAI's error shape) and the text check
"""
