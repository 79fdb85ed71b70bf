"""The per-job rendezvous store: torch's c10d TCPStore plus an authenticated control endpoint on the next port.

Runs in the rendezvous pod as `python -m elasticjob_store`, with the worker image's torch. It never imports
the operator (`elasticjob`), and the operator imports one module of it, protocol.py (the requests and replies
of the control endpoint, standard library only): they talk over HTTP (server.py).
"""
