"""The injection service's HTTP edge, beside its gRPC one: the TGI-compatible API
(`tgi`: /generate, /generate_stream, /info, /health) and the OpenAI-compatible routes
(`openai`: /v1/completions, /v1/chat/completions, /v1/models) on one aiohttp app, with
their pure request/response mappings (`tgi_convert`, `openai_convert`). Edges only:
each route converts, makes one domain call, converts back."""
