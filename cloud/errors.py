"""Domain errors of the verifier. Each carries the gRPC status code name it maps to; the
servicer converts them at the boundary, and they end only the session that caused them."""

from __future__ import annotations


class SessionError(Exception):
    code = "INTERNAL"


class InvalidArgument(SessionError):
    code = "INVALID_ARGUMENT"


class FailedPrecondition(SessionError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(SessionError):
    code = "RESOURCE_EXHAUSTED"


class NotFound(SessionError):
    code = "NOT_FOUND"


class Unauthenticated(SessionError):
    code = "UNAUTHENTICATED"


class DeadlineExceeded(SessionError):
    code = "DEADLINE_EXCEEDED"


class OutOfRange(SessionError):
    code = "OUT_OF_RANGE"


class Unavailable(SessionError):
    """The verifier cannot score at all any more (e.g. a tensor-parallel rank was lost): the
    edge re-opens its session on another verifier."""

    code = "UNAVAILABLE"

