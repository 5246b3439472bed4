"""Request-size limits, checked before any work: the body size (ASGI middleware, 413) and how many
characters a prompt may have before it could not fit the model by any tokenisation (400)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.exceptions import HTTPException

from base_sglang.server.errors import error_body


@dataclass(frozen=True)
class Limits:
    max_request_bytes: int
    max_model_len: int  # tokens per request (prompt + output)
    max_token_chars: int  # the longest text one token of the tokenizer decodes to

    @property
    def max_prompt_chars(self) -> int:
        """No prompt longer than this can tokenise to fewer than max_model_len tokens."""
        return self.max_model_len * self.max_token_chars


def longest_token_chars(tokenizer) -> int:
    """max over the vocabulary of len(decode([id])) (one batched decode at start-up)."""
    n = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                   clean_up_tokenization_spaces=False)
    return max((len(t) for t in texts), default=1) or 1


class BodyLimit:
    """Refuse a request body over max_bytes with 413: at once when Content-Length says so (the
    body is never read), else as soon as the bytes received pass the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self._message())
            return message

        return await self.app(scope, counted, send)

    def _message(self) -> str:
        return (f"request body exceeds this server's limit of {self.max_bytes} bytes "
                f"(--max-request-bytes)")

    async def _refuse(self, send):
        import json

        body = json.dumps(error_body(413, self._message(), None, "request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
