"""llama-server's native completion route, POST /completion."""
