"""The serving shell: the gRPC server (health, auth, TLS, graceful stop), the servicer that
turns protobuf into engine calls and domain errors into status codes, Prometheus metrics,
and the nginx configuration for replicas.

    server          `acespec cloud serve`: load, serve, shut down
    servicer        the gRPC boundary: edge-decided sessions, Generate, errors as status codes
    decided_stream  decided sessions on the Session stream (a handler the servicer owns)
    metrics         Prometheus metrics of the verifier
    nginx           an nginx configuration for session-sticky replicas
"""
