"""The command line: thin shells over the protocol core, the signer backends and the verifier stores."""
