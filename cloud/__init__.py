"""The cloud side: the verifier. Three rooms, each importing only those before it:

    target/    the model: weights, attention, tree KV cache, tensor parallelism
    verify/    the verifying policy: sessions, decided sessions, proposals, batching
    serving/   the shell: gRPC server and servicer, metrics, nginx
    errors.py  domain errors (each names its gRPC status code), raised by any room
    cli.py     `acespec cloud ...`; __main__.py the same for `python -m acespec.cloud`
"""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
