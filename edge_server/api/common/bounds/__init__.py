"""What a request may ask for, held to what the model can use before any costly work:
numeric fields against the model and its context (model_bounds), prompt sizes before
tokenizing (prompt_bounds), the size of one answer (response_bounds), and prompts cut
to fit the context where asked (truncation)."""
