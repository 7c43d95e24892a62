"""The edge side: drafters (llama.cpp, n-gram), and (later) the engine, state cache, local API."""
