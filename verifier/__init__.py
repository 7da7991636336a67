"""The verifier service and its durable stores."""
