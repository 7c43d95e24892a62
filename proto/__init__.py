"""Wire protocol: acespec.proto, its generated stubs (committed; regenerate with
scripts/gen_proto.sh) and the codec between protobuf and `acespec.shared` types."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])

PROTOCOL_VERSION = 2  # Open and GenerateRequest carry it; a verifier refuses any other
# gRPC metadata naming the edge session, so a load balancer can hash on it (stickiness).
SESSION_KEY = "x-acespec-session"
# gRPC metadata naming the edge (one per edge process): its sessions share one client's part
# of the verifier's passes where the verifier asks for no token (docs/design.md §3).
CLIENT_KEY = "x-acespec-client"
