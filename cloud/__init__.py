"""The cloud side: the torch target model, its tree KV cache, and (later) the gRPC verifier."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
