"""The signer daemon and its key backends (one daemon per deployer)."""
