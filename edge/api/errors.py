"""The API's error in OpenAI's shape, and the text check every string field goes through."""

from __future__ import annotations


class ApiError(Exception):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers  # e.g. Retry-After on a 503

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def text(value, param: str) -> str:
    """A string that is valid Unicode text (JSON can spell a lone surrogate, "\\ud800",
    which no tokenizer can encode): 400 naming the field otherwise."""
    if not isinstance(value, str):
        raise ApiError(400, f"'{param}' must be a string", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"'{param}' is not valid Unicode text: a lone surrogate "
                       f"(\\u{ord(value[e.start]):04x}) at character {e.start}", param) from None
    return value


def same_json(a, b) -> bool:
    """JSON equality: `true` is not `1`, but `0.0` is `0`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
