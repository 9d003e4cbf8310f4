"""Images: the multimodal projector (llama.cpp's mtmd) that turns decoded images into
embedding tokens (projector), and the checks of a projector file made in Python before
mtmd reads it (projector_check).

May import: engine.backend.
Imported by: the scheduler core (request, image_prefill, engine) and the HTTP layer's
image preparation.
"""
