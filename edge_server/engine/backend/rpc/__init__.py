"""llama.cpp's RPC backend: remote devices named by `--rpc`, checked before use."""
