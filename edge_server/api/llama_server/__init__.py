"""llama-server's own routes: /completion, /infill, /rerank, /props, /slots,
/tokenize, /detokenize and /apply-template."""
