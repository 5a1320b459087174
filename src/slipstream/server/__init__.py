"""The OpenAI-compatible server: `slipstream serve`. Two processes: the API process (FastAPI on
uvicorn: HTTP, JSON, SSE framing) and the engine process (the LLM and its loop thread, tokenization
and detokenization), talking over a Unix socket pair (channel.py) in msgspec's msgpack structs (protocol.py), so the API's
Python work never takes the engine loop's interpreter lock."""
