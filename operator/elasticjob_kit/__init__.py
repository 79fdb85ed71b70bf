"""The job pod's kit: the operator's own pod programs, copied into each job pod so that any image with torch runs them.

The operator's init container (`python -m elasticjob_kit DIR`, from the operator's image) copies into an emptyDir:
- `lib/`: `elasticjob_store` (the rendezvous store), `elasticjob_warm` (warm worker starts), and for scripts
  that import them `elasticjob_progress` (the progress API) and `elasticjob_ckpt` (checkpoints in memory): the
  operator's own versions, so none has to be in the user's image;
- `bin/launch`: a POSIX shell script (launch.sh) run by a static busybox copied beside it, so it needs no
  shell in the image. It finds the Python that runs the image's torch and starts our module with it, or runs
  the user's command as written when it cannot;
- `path/torchrun`: the launcher again, for commands that run torchrun from a shell (the operator puts `path/`
  first on that shell's PATH).

Runs in the init container with the operator's image; it imports neither the operator nor torch.
"""
