"""Link emulator, discrete-event model and benchmark harness (see DESIGN §7-§8)."""

from acespec.layout import require_subpackage

require_subpackage(__name__, __path__[0])
