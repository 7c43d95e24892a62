"""Link emulator, discrete-event model and benchmark harness (see DESIGN §7-§8)."""
