"""Wire protocol: acespec.proto, its generated stubs (committed; regenerate with
scripts/gen_proto.sh) and the codec between protobuf and `acespec.shared` types."""

PROTOCOL_VERSION = 1
