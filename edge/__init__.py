"""The edge side (no torch, no acespec.cloud): the user's machine drafts with a small model
and keeps the committed text, while a remote verifier scores or decides.

    session/      one request against the verifier: engine, runner, one driver per protocol
    speculation/  the speculation tree: branch allocation, calibration, shape
    drafting/     drafters behind one interface (llama.cpp, n-gram)
    api/          the local OpenAI-compatible HTTP API
    client.py     the wire protocol's client (CloudSession over gRPC, Generate)
    text.py       tokenization and chat templates (TextCodec, chat_segments)
    cli.py        `acespec edge generate | serve`; status.py its live status line
"""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
