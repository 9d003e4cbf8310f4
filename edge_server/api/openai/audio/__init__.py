"""POST /v1/audio/transcriptions and /v1/audio/translations: a clip's words, written by
a model whose projector reads audio."""
