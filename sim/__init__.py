"""Link emulator, discrete-event model and benchmark harness (see docs/design.md §7-§8)."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
