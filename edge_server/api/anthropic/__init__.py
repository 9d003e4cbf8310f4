"""Anthropic's protocol: Messages (/v1/messages) and token counting."""
