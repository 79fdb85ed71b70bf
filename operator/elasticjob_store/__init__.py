"""The per-job rendezvous store: a c10d TCPStore server (torch's wire protocol, served without importing torch) plus
an authenticated control endpoint on the next port.

Runs in the rendezvous pod as `python -m elasticjob_store`, in the worker image: its torch is imported only by the
check of whether the nudges may run (compat.py, in a child process). It never imports
the operator (`elasticjob`), and the operator imports one module of it, protocol.py (the requests and replies
of the control endpoint, standard library only): they talk over HTTP (server.py).
"""
