"""The model catalogue: which models the server knows and where their files are (store,
spec, names, hub_download, the embedded default_model and its default_conversion), and
which of them are loaded within the memory budget (pool, budget). Over the engine,
under the HTTP layer."""
