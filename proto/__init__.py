"""Wire protocol: acespec.proto and its generated stubs (added with the verifier service)."""
