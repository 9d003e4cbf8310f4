"""llama.cpp itself: the process-wide backend and its log (runtime), one GGUF model and
its context (llama_model), the context's size (context_size) and what a model will hold
before it loads (load_estimate, from gguf_header), the reusable decode batch (batch).
    cpu/       which CPU kernels are safe here (the probe) and where weights are placed
    measure/   measured once on a loaded model: step cost, threads, file read speed
    rpc/       layers on RPC servers (rpc_devices) and the guard around their calls

May import: llama_cpp, numpy and the standard library; nothing else of edge_server.
Imported by: every other engine part that touches llama.cpp, the CLI's `info`, and the
default model's conversion (runtime, for llama.cpp's log).
"""
