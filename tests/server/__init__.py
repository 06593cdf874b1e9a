"""Tests of the OpenAI-compatible server (specdecode.server)."""
