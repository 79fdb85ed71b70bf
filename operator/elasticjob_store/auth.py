"""Who may use the store's control endpoint: whoever offers, as `Authorization: Bearer <token>`, the token the
operator derived for this job.

The pod is given the token's SHA-256 (ELASTICJOB_RDZV_TOKEN_SHA256), never the token: whoever can read the pod
spec learns only the digest. A token file (ELASTICJOB_RDZV_TOKEN_FILE, a mounted Secret: how store pods made by
earlier operators get theirs) is still honoured, and read on every request, so a rotated Secret takes effect at
once. With neither, every control request is refused. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping

TOKEN_MAX_BYTES = 4096
# The operator's tokens are 64 hex characters (HMAC-SHA256); a shorter one, offered or in a token file, is
# refused: it could be guessed.
TOKEN_MIN_BYTES = 32
DIGEST = re.compile(r"[0-9a-f]{64}")
DIGEST_ENV = "ELASTICJOB_RDZV_TOKEN_SHA256"
FILE_ENV = "ELASTICJOB_RDZV_TOKEN_FILE"


class Credential:
    def __init__(self, digest: str | None = None, token_file: str | None = None) -> None:
        self.digest = digest.lower().encode() if digest and DIGEST.fullmatch(digest.lower()) else None
        self.token_file = token_file or None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Credential:
        return cls(env.get(DIGEST_ENV) or None, env.get(FILE_ENV) or None)

    def configured(self) -> bool:
        return self.digest is not None or read_token(self.token_file) is not None

    def accepts(self, authorization: str) -> bool:
        """Whether an Authorization header carries the job's token."""
        if not authorization.startswith("Bearer "):
            return False
        offered = authorization[len("Bearer "):].strip().encode()[:TOKEN_MAX_BYTES]
        if len(offered) < TOKEN_MIN_BYTES:
            return False
        if self.digest is not None:
            return hmac.compare_digest(hashlib.sha256(offered).hexdigest().encode(), self.digest)
        token = read_token(self.token_file)
        return token is not None and hmac.compare_digest(offered, token)


def read_token(path: str | None) -> bytes | None:
    """The token in a file, or None when there is none (no file named, missing, or shorter than
    TOKEN_MIN_BYTES: every control request is then refused)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read(TOKEN_MAX_BYTES).strip()
    except OSError:
        return None
    return token if len(token) >= TOKEN_MIN_BYTES else None
