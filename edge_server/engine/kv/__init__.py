"""The KV cache and the prompt caches beyond it: which sequence holds which tokens and
where a new prompt's prefix can be found (slots, over slot), recurrent states kept at prompt
ends (checkpoints), and prefixes spilled to RAM and disk
(prompt_store).

May import: engine.backend.
Imported by: the scheduler core (seating, jobs, scheduler, engine).
"""
