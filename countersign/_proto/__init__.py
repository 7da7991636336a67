"""Generated gRPC code (private). Regenerate with `make proto`."""
