"""OpenAI-compatible PD routing proxy."""
