"""POST /infill: code completion at the cursor (fill-in-the-middle), in the request shape
llama.vscode and llama.vim send to llama-server."""
