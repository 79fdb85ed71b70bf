"""The per-job rendezvous store: torch's c10d TCPStore plus an authenticated control endpoint on port + 1.

Runs in the rendezvous pod as `python -m elasticjob_store`, with the worker image's torch. It never imports
the operator (`elasticjob`), and the operator never imports it: they talk over HTTP (server.py).
"""
