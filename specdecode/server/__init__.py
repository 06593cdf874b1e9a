"""OpenAI-compatible HTTP server around the speculative engine (see app.create_app / app.run_server)."""
