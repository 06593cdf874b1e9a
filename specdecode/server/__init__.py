"""OpenAI-compatible HTTP server around the speculative engine (app.create_app; serve_command.run_server)."""
