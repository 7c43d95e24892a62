"""Pure logic used by both the edge and the cloud: sampling transforms, vocab identity,
rejection sampling, config dataclasses. No I/O beyond reading a tokenizer file; no torch."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
