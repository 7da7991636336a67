"""The coordinator: serves the operator-signed admission registry."""
