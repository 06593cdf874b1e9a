"""Bounds on what one connection may hold, as plain constants: `specdecode serve`'s flags default to them, and the
CLI reads them without importing the server's web libraries."""

# How long a client may take to send a request: its headers (from the connection's start, or from the end of its
# last answer), then its whole body (4 MB at ~1 Mbit/s). A half-sent request was held forever, and with it a socket:
# enough of them and accept() fails for everyone (review turn 5, finding 6). A proxy in front may set its own.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
# At most this many connections (open, or answering) are served at once; past it uvicorn answers 503. The queue holds
# --queue-size requests and the batch --max-batch, so this leaves ample room for waiting and idle keep-alive clients.
LIMIT_CONCURRENCY = 512
TIMEOUT_KEEP_ALIVE_S = 5  # uvicorn's default, said here: an idle connection between requests is closed after it
