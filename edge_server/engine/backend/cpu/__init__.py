"""The CPU kernels llama.cpp may use here: a probe of which are safe, and where the
weights are placed."""
